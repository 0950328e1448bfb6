"""What the committed GPU runs under results/gpu say, read back: the figures the pages quote, and the tables of the
compile policy (tuner/engine/compile.py) that rest on them. The campaign's code itself: tests/test_campaign.py."""

import json
import re
from pathlib import Path

from tuner.engine.compile import INDUCTOR_CONFIGS

INDUCTOR_DEFAULT = INDUCTOR_CONFIGS[0][0]

ROOT = Path(__file__).resolve().parents[1]


def test_the_pages_quote_the_h100_speed_stage_as_committed():
    """docs/performance.md's and README.md's FedCP, FedPAC and profile figures, from the committed campaign.json."""
    run = json.loads((ROOT / "results/gpu/speed-h100-ea133d7/campaign.json").read_text())
    flat = lambda page: " ".join((ROOT / page).read_text().split())  # noqa: E731
    fedcp, fedpac, prof = run["speed"]["figures"]["fedcp"], run["speed"]["figures"]["fedpac"], run["profile"]
    assert run["environment"]["name"] == "NVIDIA H100 80GB HBM3" and run["environment"]["commit"] == "ea133d7"
    assert fedcp["compile retries"] == 1 and fedcp["whole round recompiles"] == 0 and fedpac["compile retries"] == 0
    performance = flat("docs/performance.md")
    for phrase in [
        f"FedCP, Table 1 training: {fedcp['eager s/round']:.2f} s a round eager; compiled, a whole round with "
        "every client's evaluation "
        f"{fedcp['compiled whole round s']:.3f} s; {fedcp['compile + first round s']:.0f} s compiling the "
        f"first round ({fedcp['programs']} programs",
        f"a second trial {fedcp['second trial programs']} programs, its first round "
        f"{fedcp['second trial: compile + first round s']:.2f} s; "
        f"the chain bound {fedcp['chain bound s']:.3f} s",
        f"Its training-only figure ({fedcp['compiled s/round']:.2f} s) counts {fedcp['recompiles']} programs "
        "compiled during its timed rounds",
        f"{fedpac['eager s/round']:.3f} s a round eager against {fedpac['compiled s/round']:.3f} compiled "
        f"({fedpac['eager / compiled']:.1f}×), "
        f"{fedpac['compiled whole round s']:.3f} with evaluation; {fedpac['compile + first round s']:.0f} s "
        "compiling the first round "
        f"({fedpac['programs']} programs, under the default configuration); a second trial "
        f"{fedpac['second trial programs']} programs",
        f"{fedpac['% of chain bound']:.0f} % of its chain bound ({fedpac['chain bound s']:.3f} s)",
        f"20 compiled steps in {prof['wall_s']:.3f} s, every one a CUDA graph ({prof['graph calls']} graph "
        f"calls with the 20 steps before them that compiled, {prof['graph skips']} skipped), "
        f"and the GPU busy {100 * prof['device_busy_share']:.0f} % of that time",
    ]:
        assert phrase in performance, phrase
    assert (
        f"On an H100 FedPAC's Table 1 round ran in {fedpac['compiled s/round']:.3f} s compiled against "
        f"{fedpac['eager s/round']:.3f} eager, "
        f"and FedCP's whole round with evaluation in {fedcp['compiled whole round s']:.2f} s against "
        f"{fedcp['eager s/round']:.2f} eager"
    ) in flat("README.md")


def test_the_performance_page_quotes_the_h200_compile_diagnostics_as_committed():
    """FedAvg's second trial compiled its default-configuration shapes again (dynamo's backend guard), and pFedMe's
    compile fails in Triton: what docs/performance.md says of them, from the committed logs and figures."""
    folder = ROOT / "results/gpu/h200-9f08411"
    fedavg = json.loads((folder / "fedavg-speed.json").read_text())
    figures = fedavg["figures"]["fedavg"]
    assert (fedavg["commit"], fedavg["machine"], fedavg["torch"]) == (
        "9f08411",
        "NVIDIA H200, 16 CPU cores",
        "2.11.0+cu130",
    )
    assert figures["recompiles"] == 0 and figures["compile retries"] == 1 and figures["second trial programs"] == 2
    log = (folder / "fedavg-speed.log").read_text()
    # each recompile of tuner/engine/steps.py's step (frame 0), once, with the size that caused it
    sizes = list(
        dict(
            re.findall(
                r"\[0/(\d+)\] \[__recompiles\] +- 0/\d+: tensor 'x' size mismatch at index 0\. expected \d+, "
                r"actual (\d+)",
                log,
            )
        ).values()
    )
    assert sizes == [
        "16",
        "8",
        "8",
        "4",
        "2",
        "1",
        "20",
        "16",
    ]  # 8 once a configuration; then the second trial's 20 and 16
    assert log.count("BACKEND_MATCH failure") == 2
    pfedme = (folder / "pfedme.log").read_text()
    assert "NameError('in_ptr8 is not defined')" in pfedme and "in_ptr7, in_ptr9," in pfedme
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    for phrase in [
        "FedAvg's timed rounds compiled nothing (its padded sizes 20 and 16 under the default configuration, "
        "8 failed, and 8, 4, 2, 1 under the second)",
        f"But a second trial in the same process compiled 20 and 16 again ({figures['second trial programs']} "
        "programs)",
        "`NameError('in_ptr8 is not defined')`",
    ]:
        assert phrase in performance, phrase


def test_the_pages_quote_the_h200_check_as_committed():
    """README.md and docs/performance.md's figures of the GPU check, from its committed campaign.json."""
    check = json.loads((ROOT / "results/gpu/check-h200-a50e3b0/campaign.json").read_text())
    flat = lambda page: " ".join((ROOT / page).read_text().split())  # noqa: E731
    checks, speed, prof = check["correctness"]["checks"], check["speed"]["figures"], check["profile"]
    gpfl, fedavg = speed["gpfl"], speed["fedavg"]
    passed = [c for c in checks.values() if c["status"] == "passed"]
    assert check["environment"]["name"] == "NVIDIA H200" and check["environment"]["torch"] == "2.11.0+cu130"
    assert (
        check["correctness"]["failed"] == ["compiled: pfedme"]
        and "SubprocException" in checks["compiled: pfedme"]["message"]
    )
    assert [n for n, c in checks.items() if c.get("inductor") == INDUCTOR_DEFAULT] == ["compiled: gpfl"]
    largest = max(c["max_abs_difference"] for c in passed)
    performance = flat("docs/performance.md")
    for phrase in [
        f"Correctness: {len(passed)} of {len(checks)} families compiled on the GPU equal sequential eager on "
        f"the CPU in float64 (largest difference {largest:.1e})",
        f"every compiled step a CUDA graph ({sum(c['graph calls'] for c in passed)} graph calls, "
        f"{sum(c['graph skips'] for c in passed)} skipped)",
        f"{gpfl['eager s/round']:.2f} s a round eager, {gpfl['compiled s/round']:.3f} compiled "
        f"({gpfl['eager / compiled']:.1f}×), "
        f"{gpfl['compiled whole round s']:.3f} with every client's evaluation; "
        f"{gpfl['compile + first round s']:.0f} s compiling the first round "
        f"({gpfl['programs']} programs); a second trial {gpfl['second trial programs']} programs, its first "
        f"round {gpfl['second trial: compile + first round s']:.2f} s",
        f"is {gpfl['% of chain bound']:.0f} % of the chain bound ({gpfl['chain bound s']:.3f} s",
        f"FedAvg: {fedavg['eager s/round']:.2f} s eager; its compiled training-only figure "
        f"({fedavg['compiled s/round']:.2f} s) counts "
        f"{fedavg['recompiles']} programs compiled during its timed rounds",
        f"compiled, {fedavg['compiled whole round s']:.3f} s, against a ceiling of {fedavg['ceiling s/round']:.3f} s",
        f"20 compiled steps of GPFL's cohort in {prof['wall_s']:.3f} s ({1000 * prof['wall_s'] / 20:.1f} ms a step)",
        f"(the implicit GEMM forward, {prof['top'][1]['calls']} calls, {prof['top'][1]['ms']:.1f} ms",
        f"with {sum(k['calls'] for k in prof['top'] if 'Nhwc' in k['name'] or 'nhwc' in k['name'])} layout transposes",
        f"the profile's busy share ({100 * prof['device_busy_share']:.0f} %)",
    ]:
        assert phrase in performance, phrase
    assert (
        f"On an H200 the compiled engine ran GPFL's Table 1 round in {gpfl['compiled s/round']:.3f} s against "
        f"{gpfl['eager s/round']:.2f} eager, "
        f"every step a CUDA graph, and {len(passed)} of {len(checks)} families of methods equal to the CPU "
        "reference in float64 (pFedMe fails "
        "to compile there and runs eager); 2000 training rounds still take about "
        f"{round(2000 * gpfl['compiled s/round'] / 60)} minutes"
    ) in flat("README.md")


def test_the_performance_page_quotes_the_h100_check_as_committed():
    """The H100 check's correctness stage and FedAvg's figures (the retry's kept programs and SHAPES_NEEDED on a GPU),
    as docs/performance.md quotes them, from the committed campaign.json files."""
    folder = ROOT / "results/gpu/check-h100-7b36476"
    check = json.loads((folder / "correctness/campaign.json").read_text())
    run = json.loads((folder / "fedavg/campaign.json").read_text())
    checks, fedavg = check["correctness"]["checks"], run["speed"]["figures"]["fedavg"]
    passed = [c for c in checks.values() if c["status"] == "passed"]
    for env in (check["environment"], run["environment"]):
        assert env["name"] == "NVIDIA H100 80GB HBM3" and env["torch"] == "2.11.0+cu130"
    assert "speed" not in check and check["correctness"]["failed"] == ["compiled: pfedme"]
    assert [n for n, c in checks.items() if c.get("inductor") == INDUCTOR_DEFAULT] == ["compiled: gpfl"]
    assert fedavg["recompiles"] == 0 and fedavg["second trial programs"] == 0 and fedavg["compile retries"] == 1
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    for phrase in [
        f"{len(passed)} of {len(checks)} families compiled on the GPU equal sequential eager on the CPU in "
        "float64 (largest "
        f"difference {max(c['max_abs_difference'] for c in passed):.1e}), every compiled step a CUDA graph "
        f"({sum(c['graph calls'] for c in passed)} graph calls, {sum(c['graph skips'] for c in passed)} "
        f"skipped), in {check['correctness']['seconds']:.0f} s",
        f"FedAvg alone, at commit 7b36476: {fedavg['eager s/round']:.2f} s a round eager, "
        f"{fedavg['compiled s/round']:.3f} compiled "
        f"({fedavg['eager / compiled']:.1f}×), {fedavg['compiled whole round s']:.3f} with every client's evaluation; "
        f"{fedavg['compile + first round s']:.0f} s compiling the first round ({fedavg['programs']} programs",
        f"{fedavg['recompiles']} programs compiled during its timed rounds and a second trial "
        f"{fedavg['second trial programs']} programs, "
        f"its first round {fedavg['second trial: compile + first round s']:.2f} s",
        f"{fedavg['% of chain bound']:.0f} % of its chain bound ({fedavg['chain bound s']:.3f} s) and "
        f"{fedavg['% of ceiling']:.0f} % of its "
        f"ceiling ({fedavg['ceiling s/round']:.3f} s)",
    ]:
        assert phrase in performance, phrase
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"FedAvg's training round in {fedavg['compiled s/round']:.3f} s against {fedavg['eager s/round']:.2f} "
        "eager, its second trial "
        "compiling nothing"
    ) in readme


def test_the_methods_auto_compiles_on_cuda_are_those_the_committed_checks_passed():
    """`auto`'s CUDA table (tuner/engine/compile.py CUDA_CHECKED) is what the GPU checks under results/gpu measured, a
    (method, backbone) pair each: every pair whose compiled check passed (all compiled, every step a CUDA graph),
    none whose compiled check failed; a family that failed is named with its reason (CUDA_FAILS)."""
    from tuner.engine.compile import CUDA_CHECKED, CUDA_FAILS

    passed, failed = set(), set()
    for path in (ROOT / "results/gpu").glob("check-*/**/campaign*.json"):
        for name, check in json.loads(path.read_text()).get("correctness", {}).get("checks", {}).items():
            if "compiled" not in name:
                continue
            pair = checked_pair(name, check)
            if check["status"] == "passed":
                assert check["graph skips"] == 0 and check["graph calls"] > 0, (path, name)
                passed.add(pair)
            elif check["status"] == "failed":
                failed.add(pair)
    assert failed == {("pfedme", "mlp"), ("feddyn", "mlp")} and not failed & passed
    assert CUDA_CHECKED == passed and set(CUDA_FAILS) == {m for m, _ in failed}


def checked_pair(name: str, check: dict) -> tuple[str, str]:
    """(method, backbone) of a correctness check: recorded in it since the checks took a backbone; before, the
    method ends its name ("compiled: m", "... (fedper)") and the backbone was digits' MLP but for ResNet-18's case."""
    if "method" in check:
        return check["method"], check["backbone"]
    method = re.sub(r".*\((\w[\w-]*)\)$", r"\1", name).split(": ")[-1]
    return method, "resnet18" if "ResNet-18" in name else "mlp"


def test_the_performance_page_quotes_the_h200_check_at_7a0cf86_as_committed():
    folder = ROOT / "results/gpu/check-h200-7a0cf86"
    run = json.loads((folder / "speed/campaign.json").read_text())
    assert run["environment"]["name"] == "NVIDIA H200" and run["environment"]["commit"] == "7a0cf86"
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    names = {"gpfl": "GPFL", "fedavg": "FedAvg", "fedpac": "FedPAC", "fedcp": "FedCP"}
    for method, f in run["speed"]["figures"].items():
        assert f["recompiles"] == f["graph skips"] == 0
        row = (
            f"| {names[method]} | {f['eager s/round']:.3g} | {f['compiled s/round']:.3f} | "
            f"{f['compiled whole round s']:.3f} | {f['compile + first round s']:.0f} s | "
            f"{f['second trial programs']} | {f['% of chain bound']:.0f} |"
        )
        assert row in performance, row
    prof = run["profile"]
    assert (
        f"20 compiled steps of GPFL's cohort in {prof['steps_s']:.3f} s timed by CUDA events with no profiler running "
        f"({1e3 * prof['steps_s'] / 20:.1f} ms a step), {prof['window_s']:.3f} s inside the profiler's timed window, "
        f"the GPU busy {100 * prof['device_busy_share']:.0f} % of that window"
    ) in performance
    assert prof["top"][0]["name"].startswith("void implicit_convolve_sgemm") and prof["top"][0]["calls"] == 400
    checks = {}
    for path in sorted((folder / "correctness").glob("campaign-*.json")):
        checks |= json.loads(path.read_text())["correctness"]["checks"]
    passed = {n: c for n, c in checks.items() if c["status"] == "passed"}
    failed = [n for n, c in checks.items() if c["status"] == "failed"]
    assert len(passed) == 11 and failed == ["executors equal (compiled): feddyn"]
    largest = max(c["max_abs_difference"] for c in passed.values())
    assert f"(largest difference {largest:.1e})" in performance
    assert "after 12 of 72" in performance and len(passed) + len(failed) == 12
    readme = " ".join((ROOT / "README.md").read_text().split())
    f = run["speed"]["figures"]
    assert (
        f"At commit 7a0cf86 on an H200, from an empty compile cache: GPFL {f['gpfl']['compiled s/round']:.3f} s a "
        f"round, FedAvg {f['fedavg']['compiled s/round']:.3f}, FedCP {f['fedcp']['compiled s/round']:.3f} and "
        f"FedPAC {f['fedpac']['compiled s/round']:.3f}"
    ) in readme
    from tuner.engine.compile import CUDA_CHECKED

    on_mlp = [m for m, backbone in CUDA_CHECKED if backbone == "mlp"]
    assert f"{len(on_mlp)} methods are checked to compile on CUDA equal to the CPU reference on the MLP" in readme


def test_the_performance_page_quotes_the_block_and_convolution_benches_as_committed():
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    blocks = json.loads((ROOT / "results/bench/step-blocks-digits.json").read_text())
    assert blocks["machine"].startswith("CPU") and f"commit {blocks['commit']}, 30 rounds each" in performance
    for label, f in blocks["figures"]["digits"].items():
        row = (
            f"| {label[2:]} | {f['compile s']:.1f} | {f['s/round']:.3f} | {f['host us/step']:.0f} | "
            f"{f['host / K=1']:.2f} | {f['in the call us/step']:.0f} |"
        )
        assert row in performance, row
    table1 = json.loads((ROOT / "results/bench/step-blocks-table1.json").read_text())
    assert f"`python bench/step_blocks.py --settings table1 --rounds 2`, commit {table1['commit']}" in performance
    for label, f in table1["figures"]["table1"].items():
        row = (
            f"| {label[2:]} | {f['compile s']:.1f} | {f['s/round']:.3f} | {f['host us/step']:.0f} | "
            f"{f['host / K=1']:.2f} | {f['in the call us/step']:.0f} |"
        )
        assert row in performance, row
    t = table1["figures"]["table1"]
    growth = [t[k]["compile s"] / t["K=1"]["compile s"] for k in ("K=4", "K=16")]
    assert f"compiling grows {growth[0]:.1f}× at K = 4 and {growth[1]:.1f}× at K = 16" in performance
    k16 = blocks["figures"]["digits"]["K=16"]
    assert f"cuts the host's time a step by {1 / k16['host / K=1']:.1f}×" in performance and k16["host / K=1"] <= 0.25
    assert f"{k16['s/round / K=1']:.2f}× slower at K = 16" in performance
    forms = json.loads((ROOT / "results/bench/conv-forms-cpu.json").read_text())["figures"]["forms"]
    grouped, unfold, last = forms["grouped"], forms["unfold"], forms["channels_last"]
    assert (
        f"grouped convolution {grouped['eager ms/step']:.1f} ms a step eager and {grouped['compiled ms/step']:.1f} "
        f"compiled; `unfold` {unfold['eager / grouped']:.2f}× and {unfold['compiled / grouped']:.2f}× that; "
        f"a `channels_last` form, since removed, {last['eager / grouped']:.2f}× and {last['compiled / grouped']:.2f}×"
    ) in performance
