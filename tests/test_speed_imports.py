"""What the README job's process imports, and the reader's pandas-free Arrow helpers (issue 29).

Speed targets live in benchmarks/speed.py; these tests check the structure that the speed
depends on: the command line defers dp_accounting's ``__init__`` (its PLD accountant and
calibration pull in scipy.stats and scipy.signal), a release imports neither pandas nor the
Opacus package nor scipy.stats in its own process (the PRV and PLD accountants run in a worker
process), and the Arrow helpers equal pyarrow's own conversions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dpsummary.data import arrow_bool_mask, arrow_empty_string
from dpsummary.data.stream import arrow_to_numpy

ROOT = Path(__file__).resolve().parents[1]

_DEFERRED = """
import json, sys, threading
from dpsummary.cli.common import defer_package_inits
defer_package_inits()
out = {"before": "dp_accounting" in sys.modules}
from dp_accounting import dp_event
import dp_accounting.dp_event
out["events only"] = [m for m in ("dp_accounting.pld", "scipy.stats", "dp_accounting.rdp") if m in sys.modules]
import dp_accounting
got = []
threads = [threading.Thread(target=lambda: got.append(dp_accounting.GaussianDpEvent)) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
out["same class"] = all(g is dp_event.GaussianDpEvent for g in got) and len(got) == 4
out["completed"] = "dp_accounting.pld" in sys.modules and hasattr(dp_accounting, "calibrate_dp_mechanism")
from dp_accounting.pld import pld_privacy_accountant
out["pld"] = pld_privacy_accountant.PLDAccountant is dp_accounting.pld.PLDAccountant
try:
    dp_accounting.no_such_name
    out["missing"] = "no error"
except AttributeError:
    out["missing"] = "AttributeError"
print(json.dumps(out))
"""


def test_deferred_package_init_loads_submodules_alone_then_completes_on_first_use() -> None:
    done = subprocess.run([sys.executable, "-c", _DEFERRED], capture_output=True, text=True, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"before": False, "events only": [], "same class": True, "completed": True, "pld": True,
                   "missing": "AttributeError"}


_RELEASE = """
import json, sys
heavy = json.loads(sys.argv[3])
sys.argv = ["dpsummary", "release", "--epsilon", "0.2", sys.argv[1], "--out", sys.argv[2]]
from dpsummary.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": [m for m in heavy if m in sys.modules]}))
"""


def test_readme_release_process_imports_no_pandas_opacus_or_scipy_stats(tmp_path: Path) -> None:
    """A zero-configuration release (the README job's path) succeeds without importing pandas,
    the Opacus package, scipy.stats/signal or dp_accounting's PLD modules in its own process."""
    heavy = ["pandas", "opacus", "scipy.stats", "scipy.signal", "dp_accounting.pld", "dp_accounting.mechanism_calibration"]
    env = {**os.environ, "DPSUMMARY_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _RELEASE, str(ROOT / "examples" / "adult.csv"), str(tmp_path / "a.json"),
                           json.dumps(heavy)], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"code": 0, "loaded": []}, done.stderr[-2000:]
    claim = json.loads(__import__("base64").b64decode(json.loads((tmp_path / "a.json").read_text())["payload"]))
    assert set(claim["predicate"]["claim"]["epsilon"]) == {"rdp", "prv", "pld"}


def _arrays() -> list[pa.Array]:
    rng = np.random.default_rng(0)
    values = rng.normal(size=50)
    mask = rng.random(50) < 0.2
    out: list[pa.Array] = []
    for typ in (pa.float64(), pa.int32(), pa.int64(), pa.float32(), pa.uint8()):
        arr = pa.array(values * 10 if typ != pa.uint8() else np.abs(values * 10), type=typ, from_pandas=False,
                       safe=False, mask=mask)
        out += [arr, arr.slice(3, 30), arr.slice(7, 0), pc.fill_null(arr, pa.scalar(1, typ)).slice(1, 40)]
    flags = pa.array(rng.random(50) < 0.5, mask=mask)
    out += [flags, flags.slice(5, 33), pc.fill_null(flags, False).slice(9, 20)]
    return out


@pytest.mark.parametrize("index", range(23))
def test_arrow_to_numpy_equals_pyarrows_to_numpy(index: int) -> None:
    arr = _arrays()[index]
    null = False if pa.types.is_boolean(arr.type) else (np.nan if pa.types.is_floating(arr.type) else 0)
    expected = pc.fill_null(arr, pa.scalar(null, arr.type)).to_numpy(zero_copy_only=False)
    got = arrow_to_numpy(arr, null=null)
    assert got.dtype == expected.dtype and np.array_equal(got, expected, equal_nan=True)
    if arr.null_count:
        with pytest.raises(ValueError, match="nulls"):
            arrow_to_numpy(arr)


def test_arrow_constants_equal_pyarrows_conversions() -> None:
    assert arrow_empty_string().equals(pa.scalar("", pa.string()))
    flags = np.random.default_rng(1).random(77) < 0.3
    assert arrow_bool_mask(flags).equals(pa.array(flags))
    assert arrow_bool_mask(np.zeros(0, dtype=bool)).equals(pa.array([], pa.bool_()))
    with pytest.raises(TypeError):
        arrow_to_numpy(pa.array(["a"]))
