"""sweep.enqueue: settings a study runs before any drawn ones, once per study."""

import os
import subprocess
import sys
import threading
import uuid

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution

from rookworld.config import CONF_DIR, compose
from rookworld.sweeps import report
from rookworld.sweeps.callbacks import enqueue_trials

optuna.logging.set_verbosity(optuna.logging.WARNING)
POINT = {"lr": 3e-5, "kind": "group"}
DISTS = {"lr": FloatDistribution(1e-6, 1e-2, log=True),
         "kind": CategoricalDistribution(("group", "ema_norm"))}


def _ask(study, tag=None):
    """What the Hydra sweeper does with a trial: ask, suggest every parameter (and the
    trial-number tag rookworld.sweeps.trial.tag adds)."""
    trial = study.ask()
    for name, dist in DISTS.items():
        trial._suggest(name, dist)
    if tag is not None:
        trial.suggest_int("sweep.trial", trial.number, trial.number)
    return trial


def test_a_point_is_queued_once_and_again_only_after_its_trial_died(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    assert enqueue_trials(url, "s", ["maximize"], [POINT]) == [POINT]  # creates the study
    assert enqueue_trials(url, "s", ["maximize"], [POINT]) == []  # already waiting
    study = optuna.load_study(study_name="s", storage=url)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    first = _ask(study, tag=True)
    assert first.params == {**POINT, "sweep.trial": 0}  # the queued values, not drawn ones
    study.tell(first, 0.5)
    assert enqueue_trials(url, "s", ["maximize"], [POINT]) == []  # complete: held
    drawn = _ask(study, tag=True)  # the sampler's own point
    study.tell(drawn, state=optuna.trial.TrialState.FAIL)
    assert enqueue_trials(url, "s", ["maximize"], [POINT]) == []
    # a rerun whose queued trial was killed (FAIL) queues the point again
    study2 = optuna.create_study(study_name="t", storage=url, direction="maximize")
    study2.enqueue_trial(POINT)
    killed = _ask(study2)
    study2.tell(killed, state=optuna.trial.TrialState.FAIL)
    assert enqueue_trials(url, "t", ["maximize"], [POINT]) == [POINT]
    other = {"lr": 1e-4, "kind": "group"}
    assert enqueue_trials(url, "s", ["maximize"], [POINT, other]) == [other]


@pytest.mark.postgres
def test_workers_starting_together_queue_a_point_once():
    """Eight workers queue the same point into one fresh PostgreSQL study at once: it is
    queued by exactly one of them."""
    from test_sweeps_end_to_end import pg_url
    url, name = pg_url(), f"q{uuid.uuid4().hex[:8]}"
    start, queued = threading.Barrier(8), []

    def worker():
        start.wait()
        queued.extend(enqueue_trials(url, name, ["maximize"], [POINT]))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    trials = optuna.load_study(study_name=name, storage=url).trials
    assert queued == [POINT] and [t.state.name for t in trials] == ["WAITING"]


def test_the_stability_search_queues_the_training_defaults():
    """The queued point of grpo_stability is what `python -m rookworld.train` runs."""
    train = compose([])
    (point,) = compose(["hparams_search=grpo_stability"]).sweep.enqueue
    assert point["optim.lr"] == train.optim.lr and point["kl.beta"] == train.kl.beta
    assert point["algorithm.entropy_coef"] == train.algorithm.entropy_coef
    assert point["algorithm.kl_estimator"] == train.algorithm.kl_estimator
    assert point["num_generations"] == train.num_generations
    assert point["advantage"] == "group"  # the algorithm's own group advantages, by name
    assert point["algorithm"] == "grpo"  # conf/train.yaml's default algorithm
    assert compose(["advantage=group"]).algorithm.advantage == train.algorithm.advantage


def test_the_strength_search_queues_the_training_defaults_inside_its_space():
    """The queued point of the strength search is what `python -m rookworld.train` runs, and
    it lies inside the searched space (else the study would hold no reference)."""
    from rookworld.sweeps.callbacks import outside, searched_distributions
    train = compose([])
    cfg = compose(["hparams_search=strength"])
    (point,) = cfg.sweep.enqueue
    weights = train.reward.policy_weights
    assert point["reward.policy_weights.best"] == weights.best
    assert point["reward.policy_weights.top5"] == weights.top5
    assert point["algorithm.move_quality"] == train.algorithm.move_quality
    assert point["optim.lr"] == train.optim.lr and point["kl.beta"] == train.kl.beta
    assert point["sampler.temperature"] == train.sampler.temperature
    assert point["num_generations"] == train.num_generations
    assert cfg.sweep.objective == "eval/strength/puzzles_first" and cfg.sweep.replicas >= 2
    assert train.num_generations * train.prompts_per_step == cfg.batch_size
    params = OmegaConf.load(CONF_DIR / "hparams_search" / "strength.yaml").hydra.sweeper.params
    assert outside(dict(point), searched_distributions(dict(params))) == ""


def test_a_sweep_runs_the_queued_defaults_first_and_reports_them(tiny_overrides, tmp_path):
    args = [a for a in tiny_overrides if a != "num_generations=2"]  # searched, not fixed
    args += ["steps=1", "batch_size=8", "eval_every=0", "hydra.sweeper.n_trials=1"]
    env = dict(os.environ, HYDRA_FULL_ERROR="1", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "rookworld.train", "-m",
                          "hparams_search=grpo_stability", *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "queued {'optim.lr': 3e-05" in out.stdout
    study_dir = tmp_path / "multirun" / "grpo_stability"
    (trial,) = optuna.load_study(study_name="grpo_stability",
                                 storage=f"sqlite:///{study_dir}/optuna.db").trials
    assert trial.state.name == "COMPLETE" and trial.params["optim.lr"] == 3e-5
    assert trial.params["num_generations"] == 8 and trial.params["advantage"] == "group"
    text = report.main([str(study_dir)])
    assert "| 0 (queued) | COMPLETE |" in text and "#0 objective" in text


def test_a_point_outside_the_search_space_is_named_not_queued():
    from rookworld.sweeps.callbacks import outside, searched_distributions
    dists = searched_distributions({"optim.lr": "tag(log, interval(1e-6, 1e-2))",
                                    "num_generations": "choice(2, 4)"})
    assert outside({"optim.lr": 3e-5, "num_generations": 4}, dists) == ""
    assert "num_generations=8 lies outside" in outside({"optim.lr": 3e-5, "num_generations": 8},
                                                       dists)
    assert "optim.lr=0.1 lies outside" in outside({"optim.lr": 0.1, "num_generations": 2}, dists)
    assert "every searched parameter" in outside({"optim.lr": 3e-5}, dists)


def test_the_command_lines_overrides_shape_the_space_a_point_must_fit():
    """As the sweeper builds its search space: a range given on the command line replaces
    the yaml's, and a plain value fixes the parameter, so a queued point that named it is no
    longer a setting of the search (it would run under the fixed value, not its own)."""
    from rookworld.sweeps.callbacks import outside, searched_distributions
    params = {"optim.lr": "tag(log, interval(1e-6, 1e-2))", "num_generations": "choice(2, 4)"}
    point = {"optim.lr": 3e-5, "num_generations": 4}
    narrowed = searched_distributions(params, ["optim.lr=tag(log, interval(1e-4, 1e-3))",
                                               "steps=2"])
    assert "optim.lr=3e-05 lies outside" in outside(point, narrowed)
    fixed = searched_distributions(params, ["num_generations=2"])
    assert set(fixed) == {"optim.lr"} and "every searched parameter" in outside(point, fixed)
