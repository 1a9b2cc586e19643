"""The ray executor on a real Ray started by these tests on this machine: the same sweep gives
the same rows as the local executor (in process and through the CLI), a Ray worker killed
mid-case becomes a row, and any unit type (here a stand-in training unit) runs through it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ray = pytest.importorskip("ray", reason="the ray executor needs Ray: pip install 'attn-bench[ray]'")

from processes import alive, wait_for  # noqa: E402

from bench.engine.executors import LocalExecutor  # noqa: E402
from bench.engine.executors.ray import (  # noqa: E402
    NODE_RESOURCE,
    RayExecutor,
    RayMissingError,
    fits,
    reservation_for,
)
from bench.engine.executors.ray_connect import check_reachable, connect_error  # noqa: E402
from bench.engine.results import read_rows  # noqa: E402
from bench.engine.rundir import drive  # noqa: E402
from bench.runner import load_run  # noqa: E402
from bench.speed.sweep import run_sweep  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: one CPU for the Ray started here: Ray then sets OMP_NUM_THREADS=1 for its tasks, which the
#: executor must undo for the case workers to use torch's default threads as a local run does
RAY_CPUS = 1


def _sweep(**extra: Any) -> dict[str, Any]:
    return {"name": "ray", "passes": ["fwd"], "seq_len": [16], "heads": 1, "head_dim": 8,
            "repeats": 3, "min_repeats": 2, "time_budget_s": 1, "timeout_s": 60,
            "max_memory_gb": 3, "peak_matmul_size": 128, "plugins": ["bench.engine.testing"], **extra}


#: sleeps of two lengths, a real attention at two lengths, and an allocation over the 3 GiB
#: cap: oom at N=16, so N=32 is skipped without running
SAME_ROWS = _sweep(variants=[
    {"name": "bench_sleep", "seconds": 0.01},
    {"name": "bench_sleep", "seconds": 0.02},
    {"name": "sliding_window", "window": 4, "seq_len": [16, 32]},
    {"name": "bench_alloc", "nbytes": 40 * 2**30, "seq_len": [16, 32]},
])


@pytest.fixture(scope="module")
def ray_address():
    """A Ray started on this machine by the executor itself, shut down by it at the end."""
    starter = RayExecutor("cpu", num_cpus=RAY_CPUS)
    assert ray.is_initialized() and starter.slots == 1
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        starter.shutdown()
        assert not ray.is_initialized(), "the executor left running the Ray it started"


@pytest.fixture
def test_variants():
    from bench.engine.testing import unregister_test_variants

    yield
    unregister_test_variants()


def _statuses(run_dir: Path) -> set[tuple[str, str, str]]:
    rows = read_rows(run_dir)
    assert len(rows) == len({(r["case_id"], r["pass"]) for r in rows}), "duplicate rows"
    return {(r["case_id"], r["pass"], r["status"]) for r in rows}


@pytest.mark.slow  # 40 s; Ray's other tests (a killed worker, every unit type) stay in the default run
@pytest.mark.timeout(150)
def test_same_sweep_same_rows_locally_on_ray_and_through_the_cli(tmp_path, ray_address,
                                                                 test_variants):
    """The CLI sweep (a Ray job of its own) runs while the local sweep runs here: statuses do
    not depend on timings, and the module stays short."""
    path = tmp_path / "same.yaml"
    path.write_text(yaml.safe_dump(SAME_ROWS))
    log = tmp_path / "cli.log"
    with log.open("w") as out:
        cli = subprocess.Popen([sys.executable, "-m", "bench.cli", "sweep", str(path), "--out",
                                str(tmp_path / "cli"), "--executor", "ray", "--address",
                                ray_address, "--no-plots"], cwd=ROOT, stdout=out,
                               stderr=subprocess.STDOUT)
    try:
        config = load_run(SAME_ROWS)
        run_sweep(config, tmp_path / "local", executor=LocalExecutor("cpu"))
        cli.wait(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    run_sweep(config, tmp_path / "ray", executor=RayExecutor("cpu"))  # alone on the Ray node
    assert ray.is_initialized(), "an executor shut down a Ray it had not started"
    expected = _statuses(tmp_path / "local")
    assert {s for _, _, s in expected} == {"ok", "oom", "skipped"}
    assert len(expected) == 6
    assert _statuses(tmp_path / "ray") == expected
    # Ray sets OMP_NUM_THREADS=1 for a one-CPU task: the case workers must not inherit it
    threads = {r["threads"] for r in read_rows(tmp_path / "local")}
    assert {r["threads"] for r in read_rows(tmp_path / "ray")} == threads
    assert cli.returncode == 0, log.read_text()
    assert _statuses(tmp_path / "cli") == expected
    assert ray.is_initialized()  # the CLI disconnected from the cluster, leaving it running


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _command(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


def _kill_ray_worker_of(pidfile: Path) -> tuple[int, int]:
    """SIGKILL the Ray worker running the hung case whose pid is in ``pidfile``.

    The case worker's parent is the forkserver the unit started, whose parent is the Ray
    worker running the unit's task.
    """
    assert wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 60), \
        "the hanging case never started"
    case_pid = int(pidfile.read_text().split()[0])
    forkserver = _parent(case_pid)
    assert "forkserver" in _command(forkserver), _command(forkserver)
    ray_worker = _parent(forkserver)
    assert _command(ray_worker).startswith("ray::run_unit_task"), _command(ray_worker)
    assert _nice(case_pid) == 0, "the case runs at the niceness Ray gives its workers"
    pidfile.unlink()
    os.kill(ray_worker, signal.SIGKILL)
    return case_pid, ray_worker


@pytest.mark.slow  # 15-25 s; a unit of every type on Ray stays in the default run
@pytest.mark.timeout(120)
def test_a_killed_ray_worker_becomes_a_row_and_the_sweep_completes(tmp_path, ray_address,
                                                                   test_variants):
    """Ray runs the task once more after the kill; the retry hangs again and its worker is
    killed too, so the unit ends as ``killed`` rows naming Ray's report."""
    pidfile = tmp_path / "pid"
    config = load_run(_sweep(variants=[
        {"name": "bench_crash", "how": "hang", "pidfile": str(pidfile)},
        {"name": "bench_sleep", "seconds": 0.01},
    ]))
    failed: list[BaseException] = []

    def sweep() -> None:
        try:
            run_sweep(config, tmp_path / "out", executor=RayExecutor("cpu"))
        except BaseException as err:
            failed.append(err)

    thread = threading.Thread(target=sweep, daemon=True)
    thread.start()
    case_workers: list[int] = []
    try:
        first_case, first_worker = _kill_ray_worker_of(pidfile)
        case_workers.append(first_case)
        retry_case, retry_worker = _kill_ray_worker_of(pidfile)  # Ray's one retry
        case_workers.append(retry_case)
        assert retry_worker != first_worker
        thread.join(60)
        assert not thread.is_alive(), "the sweep did not finish after its unit was lost"
    finally:
        for pid in case_workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not failed, failed
    rows = {r["variant"]: r for r in read_rows(tmp_path / "out")}
    assert set(rows) == {"bench_crash", "bench_sleep"}
    assert rows["bench_sleep"]["status"] == "ok"
    assert rows["bench_crash"]["status"] == "killed"
    assert "WorkerCrashedError" in rows["bench_crash"]["reason"]
    assert wait_for(lambda: not any(map(alive, case_workers)), 10), \
        "a case worker outlived its Ray worker"


@dataclass(frozen=True)
class TinyTrainUnit:
    """Stand-in for a training grid's unit: a few steps of a tiny encoder classifier."""

    name: str
    seed: int = 0
    steps: int = 3
    fail: bool = False
    device: str = "cpu"

    @property
    def unit_id(self) -> str:
        return f"train-{self.name}"

    def describe(self) -> str:
        return f"encoder_classifier tiny, {self.steps} steps, seed {self.seed}"

    def run(self, cuda_visible: str | None = None) -> list[dict[str, Any]]:
        import torch
        import torch.nn.functional as F

        from models import create_model

        if self.fail:
            raise RuntimeError("the loss diverged")
        torch.manual_seed(self.seed)
        model = create_model("encoder_classifier", size="mini")
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(self.steps):
            ids, labels = torch.randint(3, 32, (4, 16)), torch.randint(0, 2, (4,))
            loss = F.cross_entropy(model(ids), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return [{"unit_id": self.unit_id, "status": "ok", "reason": "", "losses": losses,
                 "pid": os.getpid()}]

    def failure_rows(self, status: str, reason: str) -> list[dict[str, Any]]:
        return [{"unit_id": self.unit_id, "status": status, "reason": reason}]


def _chain(units: list[TinyTrainUnit]):
    for unit in units:
        rows = yield unit
        assert rows and rows[0]["unit_id"] == unit.unit_id  # the chain sees its own rows


@pytest.mark.slow  # an end-to-end run: in the full suite
@pytest.mark.timeout(90)
def test_any_unit_type_runs_on_ray(ray_address):
    # the test module is not importable on Ray's workers: send the unit class by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    chains = [_chain([TinyTrainUnit("a", seed=0), TinyTrainUnit("b", seed=1)]),
              _chain([TinyTrainUnit("broken", fail=True)])]
    done: dict[str, dict[str, Any]] = {}
    drive(chains, RayExecutor("cpu"), on_done=lambda unit, rows: done.update({unit.unit_id: rows[0]}))
    assert set(done) == {"train-a", "train-b", "train-broken"}
    for name in ("train-a", "train-b"):
        assert done[name]["status"] == "ok" and len(done[name]["losses"]) == 3, done[name]
        assert done[name]["pid"] != os.getpid()  # ran in a Ray worker
        assert done[name]["hostname"] and done[name]["torch_version"]  # the node's environment
    assert done["train-a"]["losses"] == pytest.approx(TinyTrainUnit("a", seed=0).run()[0]["losses"])
    assert done["train-broken"]["status"] == "error"
    assert "RuntimeError: the loss diverged" in done["train-broken"]["reason"]


def _node(name: str, cpus: float, gpus: float = 0, alive: bool = True, **extra: float) -> dict:
    return {"NodeID": name, "NodeManagerHostname": name, "Alive": alive,
            "Resources": {"CPU": cpus, "GPU": gpus, **extra}}


def test_reservation_keeps_one_unit_per_node_or_gpu():
    same = reservation_for("cpu", [_node("a", 8), _node("b", 8), _node("dead", 8, alive=False)])
    assert (same.num_cpus, same.slots, same.warning) == (8, 2, "")
    twins = reservation_for("cpu", [_node("a", 8), {**_node("a", 8), "NodeID": "a2"}])
    assert twins.slots == 2  # two nodes on one host
    mixed = reservation_for("cpu", [_node("a", 8), _node("b", 16), _node("head", 0)])
    assert (mixed.num_cpus, mixed.slots) == (16, 1) and "['a']" in mixed.warning
    assert fits(_node("b", 16), mixed) and not fits(_node("a", 8), mixed)
    assert not fits(_node("b", 16, alive=False), mixed)
    marked = reservation_for("cpu", [_node("a", 8, **{NODE_RESOURCE: 1}),
                                     _node("b", 16, **{NODE_RESOURCE: 1}), _node("c", 4)])
    assert (marked.resources, marked.num_cpus, marked.slots) == ({NODE_RESOURCE: 1}, 8, 2)
    gpus = reservation_for("cuda", [_node("a", 8, gpus=4), _node("b", 8, gpus=2)])
    assert (gpus.num_gpus, gpus.num_cpus, gpus.slots) == (1, 0, 6)
    with pytest.raises(ValueError, match="device 'cuda': the Ray cluster has no GPU"):
        reservation_for("cuda", [_node("a", 8)])
    with pytest.raises(ValueError, match=r"device: unknown value 'tpu'; allowed values are \['cpu', 'cuda'\]"):
        RayExecutor("tpu")


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails
    with pytest.raises(RayMissingError, match=r"pip install 'attn-bench\[ray\]'") as err:
        RayExecutor("cpu")
    assert isinstance(err.value, ImportError) and isinstance(err.value, ValueError)


def test_an_address_where_nothing_answers_is_one_quick_error():
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago: refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf"--address '127.0.0.1:{port}': no Ray head answers"):
        check_reachable(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 5
    with pytest.raises(ValueError, match="--address: expected HOST:PORT"):
        check_reachable("headnode")


def test_a_cluster_wanting_a_token_says_how_to_give_it():
    try:  # how ray.init reports a head that refused the connection for want of its token
        try:
            raise RuntimeError("Failed to connect to GCS. Last connection error: Traceback ...\n"
                               "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken")
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from cause
    except ConnectionError as err:
        message = connect_error("10.0.0.1:6379", err)
    assert message.startswith("--address '10.0.0.1:6379': the Ray cluster there wants its")
    assert "RAY_AUTH_MODE=token" in message and "\n" not in message
