"""`airlock bench e2b`: the full cycle a user of the E2B Python SDK pays for a throwaway sandbox,
`Sandbox.create()` + `commands.run("true")` + `kill()`, timed through the real SDK.

Reads E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY like any E2B program. Prints p50 and p95 of
each step and of the whole cycle; it never asserts a timing (the machine is noisy). It exits
non-zero only when a step fails.

With `--floor-url URL` (a null server that answers the cycle's three calls at once), the same
cycles then run against it, so that the SDK's own cost is measured in the same run: its p50 is
printed as the SDK's floor, and Airlock's p50 minus it as what Airlock's side costs. The floor's
cycles come after Airlock's, not interleaved with them: interleaved, Airlock's `run true` came
out 5.5 -> 14.5 ms slower (measured 2026-12-02), a disturbance the floor must not add.
"""

import argparse
import os
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
    parser.add_argument("--floor-url", help="a null E2B server: measure the SDK's own floor beside Airlock")
    args = parser.parse_args(argv)
    if args.iterations < 10:
        parser.error("--iterations must be at least 10")

    from e2b import Sandbox

    urls = {"airlock": (os.environ["E2B_API_URL"], os.environ["E2B_SANDBOX_URL"])}
    if args.floor_url:
        urls["floor"] = (args.floor_url, args.floor_url)
    try:
        steps = measure(Sandbox, args.iterations, urls)
    except Exception as error:  # noqa: BLE001 - one line instead of the SDK's traceback
        print(f"bench_e2b: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(f"e2b Python SDK {version('e2b')} -> {args.iterations} cycles after {WARMUP} warm-up cycles")
    print(f"{'step':<34} {'p50 ms':>9} {'p95 ms':>9}")
    for name, times in steps["airlock"].items():
        times.sort()
        print(f"{name:<34} {percentile(times, 50):>9.3f} {percentile(times, 95):>9.3f}")
    whole = percentile(steps["airlock"]["whole cycle"], 50)
    verdict = "meets" if whole <= args.target_ms else "misses"
    print(f"whole cycle p50: {whole:.3f} ms ({verdict} the {args.target_ms:g} ms target)")
    if "floor" in steps:
        print("the SDK's floor: the same cycles against a null server (answers at once), after Airlock's")
        print(f"{'step':<34} {'floor p50':>9} {'airlock-floor':>13}")
        for name, times in steps["floor"].items():
            times.sort()
            floor = percentile(times, 50)
            share = percentile(steps["airlock"][name], 50) - floor
            print(f"{name:<34} {floor:>9.3f} {share:>13.3f}")
        floor = percentile(steps["floor"]["whole cycle"], 50)
        print(f"whole cycle p50 minus the SDK's floor: {whole - floor:.3f} ms "
              f"(the SDK's floor {floor:.3f} ms; the target stays {args.target_ms:g} ms for the whole cycle)")
    return 0


def measure(Sandbox, iterations, urls):
    """Milliseconds of each step, per measured cycle, per server (`urls`: name -> (API, sandbox))."""
    steps = {server: {"create": [], "run true": [], "kill": [], "whole cycle": []} for server in urls}
    for server, (api_url, sandbox_url) in urls.items():
        # The SDK reads both at every call's connection config.
        os.environ["E2B_API_URL"] = api_url
        os.environ["E2B_SANDBOX_URL"] = sandbox_url
        for round_ in range(WARMUP + iterations):
            cycle(Sandbox, round_, steps[server])
    return steps


def cycle(Sandbox, round_, steps):
    """One create + run + kill; its steps' milliseconds go to `steps` after the warm-up."""
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


if __name__ == "__main__":
    sys.exit(main())
