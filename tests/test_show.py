"""The credit viewer: what the trainer records, the page `hp-agent show` writes, and that
page in a real headless Chromium (skipped, with the reason, where Chromium is absent)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hp_agent
from hp_agent.credit_view import VIEWS_FILE, pick_for_view
from hp_agent.files import read_jsonl_records
from hp_agent.hindsight import BLOCK_HEADER
from hp_agent.reports.show import write_page
from hp_agent.runs import JsonlLog

pytestmark = pytest.mark.slow
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,1000"]


def _run(tmp_path: Path, algo: str) -> Path:
    config = {"env": {"name": "keys"}, "algo": {"name": algo, **({"group_size": 4} if algo == "grpo" else {})},
              "rollout": {"max_new_tokens": 5}, "learner": {"lr": 1e-4},
              "trainer": {"steps": 2, "prompts_per_step": 4 if algo == "hp-rlvr" else 2, "run_dir": str(tmp_path),
                          "name": algo, "views_per_step": 2, "view_every": 1}}
    return hp_agent.train(config, progress=False).run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("show")
    return {algo: _run(folder, algo) for algo in ("hp-rlvr", "grpo")}


def _page_credits(page: str) -> list[float]:
    return [float(value) for value in re.findall(r'data-credit="([^"]+)"', page)]


def _stored_credits(views: list[dict]) -> list[float]:
    return [token["credit"] for view in views for turn in view["turns"] for token in turn["tokens"]]


def test_trainer_records_views_that_agree_with_the_logged_trajectories(runs):
    run = runs["hp-rlvr"]
    views = read_jsonl_records(run / VIEWS_FILE)
    assert [v["step"] for v in views] == [0, 0, 1, 1]  # views_per_step of each step
    trajectories = {(t["step"], t["task_id"]): t for t in read_jsonl_records(run / "trajectories.jsonl")}
    for view in views:
        logged = trajectories[(view["step"], view["task_id"])]
        assert [len(turn["tokens"]) for turn in view["turns"]] == [len(turn["action_ids"]) for turn in logged["turns"]]
        for turn, logged_turn in zip(view["turns"], logged["turns"]):
            for token, sampled in zip(turn["tokens"], logged_turn["sample_logprobs"]):
                # the causal view is the snapshot that sampled: p(chosen) is the sampler's
                assert token["causal"]["p"] == pytest.approx(math.exp(sampled), abs=2e-3)
                assert len(token["causal"]["top"]) == len(token["hindsight"]["top"]) == 5
                assert 0.0 <= token["weight"] <= 1.0
        assert all(segment["block"].startswith(BLOCK_HEADER) for segment in view["segments"])
        # the keys game costs -0.1 per invalid action: an invalid turn's tokens carry negative credit
        for turn in view["turns"]:
            if turn["invalid"] and not view["success"]:
                assert all(token["credit"] < 0 for token in turn["tokens"])


def test_show_writes_a_self_contained_page_with_the_stored_credits(runs, tmp_path):
    page_path = write_page(runs["hp-rlvr"], step=1, out=tmp_path / "page.html")
    page = page_path.read_text()
    views = [v for v in read_jsonl_records(runs["hp-rlvr"] / VIEWS_FILE) if v["step"] == 1]
    assert _page_credits(page) == _stored_credits(views)
    assert not re.search(r'(src|href)\s*=\s*"?(https?:)?//', page)  # nothing fetched from the network
    assert page.count('class="hindsight-block"') == sum(len(v["segments"]) for v in views)


def test_a_grpo_page_shows_each_turns_group_advantage(runs):
    page = write_page(runs["grpo"]).read_text()  # the last step with views
    views = [v for v in read_jsonl_records(runs["grpo"] / VIEWS_FILE) if v["step"] == 1]
    assert all(token["weight"] is None and token["hindsight"] is None
               for v in views for turn in v["turns"] for token in turn["tokens"])
    assert "hindsight-block" not in page.replace(".hindsight-block", "")  # no privileged block in GRPO
    advantages = [float(a) for a in re.findall(r"advantage (-?[0-9.]+) on every token", page)]
    assert len(advantages) == sum(len(v["turns"]) for v in views)


def test_show_refuses_a_missing_step_naming_the_ones_there(runs):
    done = subprocess.run([sys.executable, "-m", "hp_agent", "show", str(runs["hp-rlvr"]), "--step", "7"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "step 7 has no credit views" in done.stderr + done.stdout and "0, 1" in done.stderr + done.stdout


def test_views_alternate_successes_and_failures_and_the_file_stops_at_its_cap(tmp_path):
    class T:
        def __init__(self, success):
            self.success = success

    assert pick_for_view([T(False), T(False), T(True), T(False), T(True)], 4) == [2, 0, 4, 1]
    log = JsonlLog(tmp_path / "v.jsonl", max_bytes=100)
    assert not log.full
    written = [log.write({"step": k, "pad": "x" * 40}) for k in range(5)]
    assert log.full  # the trainer computes no view once this holds
    log.close()
    assert written == [True, True, False, False, False]  # lines of 63 bytes: the second crosses 100; then nothing
    assert len(read_jsonl_records(tmp_path / "v.jsonl")) == 2


def _browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("headless Chromium not found: apt-get install chromium chromium-driver (Debian) runs this test")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (make install adds it)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def test_the_page_in_headless_chromium_shades_tokens_and_shows_both_views_on_hover(runs, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    page_path = write_page(runs["hp-rlvr"], step=1, out=tmp_path / "page.html")
    views = [v for v in read_jsonl_records(runs["hp-rlvr"] / VIEWS_FILE) if v["step"] == 1]
    browser = _browser()
    try:
        browser.get(page_path.resolve().as_uri())
        assert browser.save_screenshot(str(tmp_path / "page.png"))
        assert (tmp_path / "page.png").stat().st_size > 10_000
        tokens = browser.find_elements(By.CSS_SELECTOR, ".tok")
        stored = [token for v in views for turn in v["turns"] for token in turn["tokens"]]
        assert len(tokens) == len(stored) > 0
        for element, token in zip(tokens, stored):
            assert float(element.get_attribute("data-credit")) == token["credit"]
            red, green, *_ = map(float, re.findall(r"[0-9.]+", element.value_of_css_property("background-color")))
            if token["credit"] != 0:  # shaded by sign: green above zero, red below
                assert (green > red) == (token["credit"] > 0), (token, element.value_of_css_property("background-color"))
        ActionChains(browser).move_to_element(tokens[0]).perform()
        panel = browser.find_element(By.ID, "panel")
        assert panel.is_displayed()
        assert "causal view" in panel.text and "hindsight view" in panel.text
        first = stored[0]
        assert float(panel.find_element(By.CSS_SELECTOR, ".credit").text) == pytest.approx(first["credit"], abs=1e-5)
        assert float(panel.find_element(By.CSS_SELECTOR, ".weight").text) == pytest.approx(first["weight"], abs=1e-4)
        assert json.dumps(first["causal"]["top"][0][0]) in panel.text  # the causal view's likeliest token
        blocks = browser.find_elements(By.CSS_SELECTOR, "details.hindsight-block")
        assert len(blocks) == sum(len(v["segments"]) for v in views)
        blocks[0].click()  # opening one shows the privileged block
        assert BLOCK_HEADER in blocks[0].text
    finally:
        browser.quit()


def test_report_overlays_runs_in_figures_and_a_page(runs, tmp_path):
    from hp_agent.reports.report import write_report

    page = write_report([runs["hp-rlvr"], runs["grpo"]], tmp_path / "report")
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == [
        "curves.png", "grad_norms.png", "index.html", "jsd_weights.png", "phases.png"]
    assert all((tmp_path / "report" / name).stat().st_size > 5_000 for name in ("curves.png", "phases.png"))
    text = page.read_text()
    for run in runs.values():
        final = read_jsonl_records(run / "metrics.jsonl")[-1]
        assert f"<h2>{run.name}</h2>" in text
        assert f"<td>train/grad_records_total</td><td>{final['train/grad_records_total']:.4g}</td>" in text
    # GRPO records no JSD weights: its run alone makes no JSD figure
    write_report([runs["grpo"]], tmp_path / "grpo-only")
    assert not (tmp_path / "grpo-only" / "jsd_weights.png").exists()
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        write_report([tmp_path], tmp_path / "none")
