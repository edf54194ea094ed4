"""CSV reading speed (issue 24): ``python benchmarks/csv_reading.py --label after
[--baseline-commit 8bc98b3]`` -> appends rows to benchmarks/results/csv_reading.csv.

Times one streaming pass (:func:`dpsummary.data.stream_pass`, the reader every release uses)
over each table, with a consumer that only counts rows (the reading alone), median and best of
``--repeats`` passes in this process (one torch thread, 2-core machine shared: the load average
at the start is recorded). With ``--baseline-commit``, the ``dpsummary/data.py`` of that commit
(read with ``git show``, loaded as a separate module) is timed too, its passes interleaved with
the current reader's, so both see the same load (label ``<label>-baseline-<commit>``). The
``stdlib`` row times the current per-line stdlib parser alone (``BatchStream(fallback=True)``). Tables: ``examples/adult.csv`` (48,842 rows, unquoted), the same rows
with every field quoted, and the 20-column logistic table of ``benchmarks/scale.py`` at
``--rows`` (its categorical fields are quoted by pyarrow's CSV writer), generated from its public
seed into ``--data-dir`` and reused. Curator-local timing only: nothing here is published.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "csv_reading.csv"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


class _Count:
    def __init__(self) -> None:
        self.rows = 0

    def add(self, batch: object) -> None:
        self.rows += batch.num_rows  # type: ignore[attr-defined]

    def discard(self) -> None:
        self.rows = 0


def _quoted_copy(src: Path, dst: Path) -> None:
    """Every field of ``src`` quoted (the header too), one physical line per record."""
    if dst.exists():
        return
    with open(src, newline="") as fin, open(dst, "w", newline="") as fout:
        writer = csv.writer(fout, quoting=csv.QUOTE_ALL, lineterminator="\n")
        for row in csv.reader(fin):
            writer.writerow(row)


def _baseline_module(commit: str) -> object:
    """``dpsummary/data.py`` as of ``commit``, as a module of its own (it imports no sibling)."""
    import importlib.util
    import subprocess
    import tempfile

    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:dpsummary/data.py"], check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="csv_reading_")) / f"data_{commit}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod


def _stdlib_pass(path: Path) -> tuple[_Count, int]:
    from dpsummary.data import BatchStream

    got, stream = _Count(), BatchStream(path, fallback=True)
    for batch in stream:
        got.add(batch)
    return got, stream.ragged_rows


def time_passes(path: Path, repeats: int, readers: dict[str, object]) -> dict[str, tuple[float, float, int, int]]:
    """Interleaved passes of every reader (``name -> stream_pass-like callable``)."""
    times: dict[str, list[float]] = {name: [] for name in readers}
    seen: dict[str, tuple[int, int]] = {}
    for _ in range(repeats):
        for name, run in readers.items():
            t0 = time.perf_counter()
            got, ragged = run(path)  # type: ignore[operator]
            times[name].append(time.perf_counter() - t0)
            seen[name] = (got.rows, ragged)
    return {name: (statistics.median(t), min(t), *seen[name]) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True, help="e.g. before / after")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=Path("/tmp/csv_reading"))
    ap.add_argument("--baseline-commit", default=None, help="also time dpsummary/data.py of this commit")
    ap.add_argument("--stdlib", action="store_true", help="also time the per-line stdlib parser alone")
    args = ap.parse_args()
    from dpsummary.data import stream_pass

    readers: dict[str, object] = {args.label: lambda p: stream_pass(p, _Count)}
    if args.baseline_commit:
        base = _baseline_module(args.baseline_commit)
        readers[f"{args.label}-baseline-{args.baseline_commit}"] = lambda p: base.stream_pass(p, _Count)  # type: ignore[attr-defined]
    if args.stdlib:
        readers[f"{args.label}-stdlib"] = _stdlib_pass
    import scale  # benchmarks/scale.py: the public synthetic table

    args.data_dir.mkdir(parents=True, exist_ok=True)
    adult = ROOT / "examples" / "adult.csv"
    adult_quoted = args.data_dir / "adult_quoted.csv"
    _quoted_copy(adult, adult_quoted)
    big = args.data_dir / f"logistic20_{args.rows}.csv"
    if not big.exists():
        scale.generate(big, args.rows)
    new = not OUT.exists()
    with open(OUT, "a", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        if new:
            w.writerow(["label", "table", "bytes", "rows", "ragged", "median_s", "best_s", "load_avg"])
        for name, path in (("adult", adult), ("adult, every field quoted", adult_quoted),
                           (f"logistic20 {args.rows} rows", big)):
            load = os.getloadavg()[0]
            for label, (med, best, rows, ragged) in time_passes(path, args.repeats, readers).items():
                w.writerow([label, name, path.stat().st_size, rows, ragged, f"{med:.3f}", f"{best:.3f}",
                            f"{load:.2f}"])
                fh.flush()
                print(f"{label:24s} {name:28s} {rows:>9d} rows  median {med:.3f} s  best {best:.3f} s  "
                      f"load {load:.2f}")


if __name__ == "__main__":
    main()
