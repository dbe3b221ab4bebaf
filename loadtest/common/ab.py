"""Apache Benchmark (`ab -k`) scenarios and the parser of what it prints."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

FIELDS = {
    "complete": r"Complete requests:\s+(\d+)",
    "failed": r"Failed requests:\s+(\d+)",
    "length_failures": r"Length: (\d+)",
    "non_2xx": r"Non-2xx responses:\s+(\d+)",
    "rps": r"Requests per second:\s+([\d.]+)",
    "tpr_all_ms": r"Time per request:\s+([\d.]+) \[ms\] \(mean, across all",
    "p50_ms": r"\s+50%\s+(\d+)",
    "p99_ms": r"\s+99%\s+(\d+)",
    "max_ms": r"100%\s+(\d+)",
    "min_ms": r"Total:\s+(\d+)",
}


def parse(out: str) -> dict:
    result = {}
    for key, pattern in FIELDS.items():
        m = re.search(pattern, out)
        result[key] = float(m.group(1)) if m else 0.0
    # ab calls a response "failed" when its length differs from the first one;
    # ours differ because ids grow. Only non-2xx and exceptions are errors.
    result["errors"] = result["non_2xx"] + (result["failed"] - result["length_failures"])
    return result


def command(url: str, concurrency: int, seconds: float, token: str, post_file: Path | None = None) -> list[str]:
    cmd = ["ab", "-q", "-k", "-r", "-s", "60", "-c", str(concurrency), "-t", str(seconds), "-n", "10000000",
           "-H", f"Authorization: Bearer {token}"]
    if post_file is not None:
        cmd += ["-p", str(post_file), "-T", "application/json"]
    return cmd + [url]


def run(url: str, concurrency: int, seconds: float, token: str, post_file: Path | None = None) -> dict:
    cmd = command(url, concurrency, seconds, token, post_file)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120).stdout
    result = parse(out)
    result["command"] = " ".join(c if "Bearer" not in c else "'Authorization: Bearer $TOKEN'" for c in cmd)
    return result
