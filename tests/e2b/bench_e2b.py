"""`airlock bench e2b`: the full cycle a user of the E2B Python SDK pays for a throwaway sandbox,
`Sandbox.create()` + `commands.run("true")` + `kill()`, timed through the real SDK.

Reads E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY like any E2B program. Prints p50 and p95 of
each step and of the whole cycle; it never asserts a timing (the machine is noisy). It exits
non-zero only when a step fails.
"""

import argparse
import sys
import time
from importlib.metadata import version

TARGET_P50_MS = 25.0
WARMUP = 5


def percentile(sorted_ms, pct):
    """Nearest rank, as `airlock bench` computes it."""
    index = min(max(-(-len(sorted_ms) * pct // 100) - 1, 0), len(sorted_ms) - 1)
    return sorted_ms[index]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench_e2b", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100, help="measured cycles (after 5 warm-up cycles)")
    parser.add_argument("--target-ms", type=float, default=TARGET_P50_MS, help="the whole cycle's p50 target")
    args = parser.parse_args(argv)
    if args.iterations < 10:
        parser.error("--iterations must be at least 10")

    from e2b import Sandbox

    try:
        steps = measure(Sandbox, args.iterations)
    except Exception as error:  # noqa: BLE001 - one line instead of the SDK's traceback
        print(f"bench_e2b: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(f"e2b Python SDK {version('e2b')} -> {args.iterations} cycles after {WARMUP} warm-up cycles")
    print(f"{'step':<34} {'p50 ms':>9} {'p95 ms':>9}")
    for name, times in steps.items():
        times.sort()
        print(f"{name:<34} {percentile(times, 50):>9.3f} {percentile(times, 95):>9.3f}")
    whole = percentile(steps["whole cycle"], 50)
    verdict = "meets" if whole <= args.target_ms else "misses"
    print(f"whole cycle p50: {whole:.3f} ms ({verdict} the {args.target_ms:g} ms target)")
    return 0


def measure(Sandbox, iterations):
    """Milliseconds of each step, per measured cycle."""
    steps = {"create": [], "run true": [], "kill": [], "whole cycle": []}
    for round_ in range(WARMUP + iterations):
        start = time.perf_counter()
        sandbox = Sandbox.create()
        created = time.perf_counter()
        try:
            result = sandbox.commands.run("true")
            ran = time.perf_counter()
        finally:
            killed = sandbox.kill()
        end = time.perf_counter()
        if result.exit_code != 0 or killed is not True:
            raise RuntimeError(f"cycle {round_}: exit code {result.exit_code}, kill returned {killed}")
        if round_ >= WARMUP:
            for name, seconds in (("create", created - start), ("run true", ran - created),
                                  ("kill", end - ran), ("whole cycle", end - start)):
                steps[name].append(seconds * 1000.0)
    return steps


if __name__ == "__main__":
    sys.exit(main())
