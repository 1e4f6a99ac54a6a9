"""Measures the fault plugin's stuck Worker on a real vLLM (scripts/real-vllm up
--fault-plugin): with 2 streams of load running (streamed completions of 200 tokens, back to
back), creates the stuck file with the given mode, scrapes /metrics and /health every 500 ms
for 15 s, reads the CPU use of the Worker and the EngineCore over 5 s from /proc/<pid>/stat,
then removes the file and checks that the engine recovers (docs/real-vllm.md, "Fault
plugin").

The stall is retried until it freezes running > 0 (see run_mode); the times below count from
the file's creation.

Usage: stuck_probe.py URL STUCK_FILE WORKER_PID ENGINE_CORE_PID API_PID MODE [MODE...]
"""

import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from prefill_probe import SIGNALS, health, scrape  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_percent(pids, seconds=5.0):
    """CPU use of each pid over `seconds`, as a percentage of one core."""
    before = {p: cpu_ticks(p) for p in pids}
    t0 = time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    return {p: round(100.0 * (cpu_ticks(p) - before[p]) / TICK / dt, 1) for p in pids}


class Load:
    """Streams of 200-token completions, back to back, until stopped."""

    def __init__(self, url, streams=2, tokens=200):
        self.url, self.tokens = url, tokens
        self.done = 0
        self.errors = 0
        self.stop = threading.Event()
        # Staggered: streams started together finish together, and a step that ends both
        # publishes running 0 (then the next step, holding both new requests, is the stuck
        # one).
        self.threads = [
            threading.Thread(target=self.run, args=(i * 0.2,)) for i in range(streams)
        ]
        for t in self.threads:
            t.start()

    def run(self, delay):
        time.sleep(delay)
        body = json.dumps(
            {"model": "tiny", "prompt": "1", "max_tokens": self.tokens, "ignore_eos": True,
             "stream": True}
        )
        # curl, not urllib: a Python client reading 200 events a stream is slower than the
        # engine, which then sits idle between requests.
        cmd = ["curl", "-sS", "-N", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "300",
               "-H", "Content-Type: application/json", "-d", body, f"{self.url}/v1/completions"]
        while not self.stop.is_set():
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.strip() == "200":
                self.done += 1
            else:
                self.errors += 1
                time.sleep(0.5)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def short(s):
    return {k.split(":")[1]: v for k, v in s.items()}


def run_mode(url, stuck, pids, mode):
    out = {"mode": mode}
    load = Load(url)
    time.sleep(3)
    out["cpu_before"] = dict(zip(["worker", "engine_core", "api"], cpu_percent(pids, 5).values()))
    before = scrape(url)
    # The stall holds whichever step comes next, and the gauges stay as the step before it
    # published them. Under this load the engine often sits between requests (a step that
    # finished both streams published running 0, and the next one admits a new request), so
    # a stall can freeze running at 0 with requests in flight. Those are counted, and the
    # stall is retried at another moment until it holds a decode step (running > 0).
    out["stalls_frozen_at_running_0"] = 0
    for attempt in range(10):
        time.sleep(0.1 + 0.07 * attempt)
        with open(stuck, "w") as f:
            f.write(mode)
        t0 = time.monotonic()
        time.sleep(1.0)
        if scrape(url).get("vllm:num_requests_running", 0) > 0:
            break
        out["stalls_frozen_at_running_0"] += 1
        os.remove(stuck)
        time.sleep(1.0)
    done_at_stuck = load.done
    samples, codes = [], []
    cpu = {}

    def measure_cpu():
        time.sleep(2)
        cpu.update(zip(["worker", "engine_core", "api"], cpu_percent(pids, 5).values()))

    th = threading.Thread(target=measure_cpu)
    th.start()
    while time.monotonic() - t0 < 15:
        t = time.monotonic()
        samples.append((round(t - t0, 2), scrape(url)))
        codes.append(health(url))
        time.sleep(max(0.0, 0.5 - (time.monotonic() - t)))
    th.join()
    settled = [s for t, s in samples if t >= 1.0]
    out["scrapes"] = len(samples)
    out["before"] = short(before)
    out["first"] = short(samples[0][1])
    out["settled_distinct"] = {
        k.split(":")[1]: sorted({s.get(k) for s in settled}) for k in SIGNALS
    }
    out["frozen_from_s"] = next(
        (t for t, s in samples if all(x == s for _, x in samples if _ >= t)), None
    )
    out["health_codes"] = sorted(set(codes))
    out["streams_finished_while_stuck"] = load.done - done_at_stuck
    out["cpu_stuck"] = cpu
    os.remove(stuck)
    t1 = time.monotonic()
    frozen = samples[-1][1]
    recovered = None
    while time.monotonic() - t1 < 30:
        s = scrape(url)
        if s.get("vllm:generation_tokens_total") != frozen.get("vllm:generation_tokens_total"):
            recovered = round(time.monotonic() - t1, 2)
            break
        time.sleep(0.1)
    out["counter_moved_after_removal_s"] = recovered
    done_at_removal = load.done
    time.sleep(5)
    out["streams_finished_5s_after_removal"] = load.done - done_at_removal
    load.close()
    out["load_errors"] = load.errors
    out["after"] = short(scrape(url))
    return out


def main():
    url, stuck, worker, core, api = sys.argv[1:6]
    pids = [int(worker), int(core), int(api)]
    for mode in sys.argv[6:]:
        print(json.dumps(run_mode(url, stuck, pids, mode)), flush=True)
        time.sleep(3)


if __name__ == "__main__":
    main()
