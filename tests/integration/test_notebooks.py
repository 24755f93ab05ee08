"""The notebooks and the report on real runs, moved away from where they ran: a 2-step explore run into SQL
with evals at steps 0 and 2, and a bench of the base model and one checkpoint (made with `--report`).

Both run dirs are copied elsewhere under another name and the originals removed, so every absolute path
recorded in them (config.yaml, MLflow's store and artifact URIs) points at nothing. Each notebook then runs
in a real Jupyter kernel, its `run_dir` injected after its `parameters` cell as papermill does, and the
report's page is opened in headless Chromium (installed by `.ci/chromium` when missing).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import nbformat
import pytest
from integration_settings import BASE
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell
from PIL import Image
from safetensors.torch import load_file
from services import missing_service

from operators.engine.checkpoints import write_checkpoint
from pipelines.bench import main as bench_main
from pipelines.explore import explore
from pipelines.report import main as report_main
from pipelines.report_lib.page import INDEX, REPORT_DIR
from pipelines.report_lib.runs import open_run
from schemas.config import DEFAULT_EVAL, DEFAULT_MODEL, load_config
from schemas.run_dir import MLARTIFACTS

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CHROMIUM_SCRIPT = ROOT / ".ci" / "chromium"
NOT_AVAILABLE = 3  # .ci/chromium's exit code when apt-get is not there to install the browser
SCALED = "model.layers.1.mlp.down_proj.weight"
CELL_TIMEOUT_S = 180
BROWSER_TIMEOUT_S = 120
# figures each notebook draws on these runs (an explore run with evals, a bench of two checkpoints); the
# explore run syncs no weights, so its all-zero model-version panel is left out
FIGURES = {"explore_run": 4, "experiences_sql": 2, "bench_compare": 1}
RUN_OF = {"explore_run": "explore", "experiences_sql": "explore", "bench_compare": "bench"}


def moved(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to)
    shutil.rmtree(run_dir)
    return to


@pytest.fixture(scope="module")
def moved_runs(engines, tmp_path_factory) -> dict[str, Path]:
    """The two run dirs, made on the shared engine and then moved under new names."""
    root = tmp_path_factory.mktemp("look")
    small = root / "arith_eval.jsonl"
    small.write_text("".join(DEFAULT_EVAL.read_text().splitlines(keepends=True)[:6]))
    overrides = [
        *BASE,
        "buffer.total_steps=2",
        "explorer.eval_on_startup=true",
        "explorer.eval_interval=2",
        "buffer.trainer_input.experience_buffer.storage_type=sql",
    ]
    cfg = load_config(None, overrides)
    cfg.buffer.explorer_input.eval_tasksets = [{"name": "arith_eval", "path": str(small), "repeat_times": 2}]
    explore(cfg, root / "explore-run", progress=False, engines=engines)

    base = load_file(str(DEFAULT_MODEL / "model.safetensors"))
    write_checkpoint(root / "ckpts", 2, {**base, SCALED: base[SCALED] * 1.1}, DEFAULT_MODEL)
    bench_args = [f"--set={item}" for item in BASE]
    bench_args += ["--run-dir", str(root / "bench-run"), "--no-progress", "--include-base", "--report"]
    bench_args += ["--checkpoint-dir", str(root / "ckpts"), "--taskset", str(small)]
    assert bench_main(bench_args, engines=engines) == 0
    assert (root / "bench-run" / REPORT_DIR / INDEX).is_file()  # made by --report
    return {
        "explore": moved(root / "explore-run", root / "elsewhere" / "explore-copy"),
        "bench": moved(root / "bench-run", root / "elsewhere" / "bench-copy"),
    }


def execute(notebook: Path, run_dir: Path, workdir: Path) -> nbformat.NotebookNode:
    """The notebook run in a fresh kernel with `run_dir` injected; a cell error raises (with the cell and
    its traceback), and the kernel is shut down either way."""
    nb = nbformat.read(notebook, as_version=4)
    at = next(i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", []))
    injected = new_code_cell(f"run_dir = {str(run_dir)!r}")
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, injected)
    resources = {"metadata": {"path": str(workdir)}}
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources=resources).execute()
    return nb


def outputs(nb: nbformat.NotebookNode, mime: str) -> list[str]:
    return [
        output["data"][mime]
        for cell in nb.cells
        for output in cell.get("outputs", [])
        if mime in output.get("data", {})
    ]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_each_notebook_runs_on_a_moved_run_dir_and_draws_its_figures(moved_runs, tmp_path, name):
    nb = execute(NOTEBOOKS / f"{name}.ipynb", moved_runs[RUN_OF[name]], tmp_path)
    errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert len(outputs(nb, "image/png")) == FIGURES[name]
    pages = "".join(outputs(nb, "text/html"))
    if name != "bench_compare":
        assert pages.count("<details>") > 0  # the rollout browser
    if name == "experiences_sql":
        assert "explore_copy" not in pages and "explore_run" in pages  # the table found in the file


@pytest.fixture(scope="session")
def chromium() -> str:
    """The headless browser: installed by `.ci/chromium` when missing (`.ci/run` runs it before pytest
    starts); skipped only without apt-get, and failed then under CI."""
    if not Path("/usr/bin/chromium").exists() and shutil.which("apt-get") is None:
        missing_service("chromium is not installed and apt-get is not available to install it")
    done = subprocess.run(["bash", str(CHROMIUM_SCRIPT)], capture_output=True, text=True, timeout=900)
    if done.returncode == NOT_AVAILABLE:
        missing_service(done.stderr.strip() or "chromium cannot be installed here")
    assert done.returncode == 0, f".ci/chromium failed:\n{done.stderr[-3000:]}"
    return done.stdout.strip().splitlines()[-1]


def screenshot(browser: str, page: Path, png: Path, profile: Path) -> None:
    """`page` rendered by headless Chromium into `png`. The browser runs in its own process group, which is
    killed afterwards, so no renderer or zygote outlives the test even when it hangs."""
    args = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--screenshot={png}",
        "--window-size=1200,900",
        page.as_uri(),
    ]
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = process.communicate(timeout=BROWSER_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 0 and png.is_file(), (
        f"chromium failed ({process.returncode}):\n{err[-3000:]}"
    )


@pytest.mark.timeout(600)
def test_the_reports_of_moved_runs_are_written_logged_into_the_copies_and_render(
    moved_runs, chromium, tmp_path, capsys
):
    # no versions.png: the explore run syncs no weights, and a panel of flat zeros is left out
    figures = {"explore": {"reward.png", "response_length.png", "throughput.png", "eval.png"}}
    figures["bench"] = {"bench.png"}
    for kind, run_dir in moved_runs.items():
        assert report_main([str(run_dir)]) == 0
        index = run_dir / REPORT_DIR / INDEX
        assert capsys.readouterr().out.strip() == f"report: {index.resolve()}"
        assert {p.name for p in index.parent.glob("*.png")} == figures[kind]
        run = open_run(run_dir)
        assert re.fullmatch(r"[0-9a-f]{32}", run.run_id)  # an MLflow run id; the logged files are under it:
        logged = run_dir / MLARTIFACTS / run.run_id / "artifacts" / REPORT_DIR
        assert {p.name for p in logged.iterdir()} == {INDEX, *figures[kind]}

    png = tmp_path / "explore.png"
    screenshot(chromium, moved_runs["explore"] / REPORT_DIR / INDEX, png, tmp_path / "profile")
    image = Image.open(png).convert("RGB")
    assert image.size == (1200, 900)
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50, f"the screenshot is nearly blank: {len(colours)} colours"
