"""docs/python_api.md: the engine built and stepped from Python, without Hydra."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "python_api.md"


def test_the_documented_example_builds_and_steps_an_engine(capsys):
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    assert len(code.strip().splitlines()) <= 25
    exec(compile(code, str(DOC), "exec"), {})
    lines = capsys.readouterr().out.split("\n")
    steps = [line.split() for line in lines if re.match(r"^[01] ", line)]
    assert [s[0] for s in steps] == ["0", "1"]
    assert all(-1.5 <= float(s[1]) <= 1.0 and float(s[2]) >= 0 for s in steps)
