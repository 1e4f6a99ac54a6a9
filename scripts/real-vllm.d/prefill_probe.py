"""Measures one long prefill on a real vLLM (scripts/real-vllm up --model long): sends a
prompt of N tokens with max_tokens 1 to /v1/completions and scrapes /metrics every 250 ms
while it runs, then says how the scheduler's signals moved (docs/real-vllm.md, "Long
prefills").

Usage: prefill_probe.py URL TOKENS [TOKENS...] [--every 0.25] [--json]

The prompt is made of the tiny model's own vocabulary so that its length in tokens is known:
"1 " repeated is tokenized as one token a repeat (checked against usage.prompt_tokens, which
is printed), after a first word drawn at random so that the prefix cache never serves it.
Each size is sent once, one after another, on an otherwise idle engine.
"""

import argparse
import json
import random
import re
import threading
import time
import urllib.request

SIGNALS = [
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
]
WORDS = [f"{w}{i}" for w in ("npu", "probe", "cache", "token") for i in range(1000)]
LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape(url, timeout=5):
    """{signal: value summed over label sets} of one /metrics answer."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and m.group(1) in SIGNALS:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def health(url, timeout=5):
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:  # noqa: BLE001
        return 0


def post(url, body, timeout=600):
    req = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def summarize(samples):
    """samples: [(t, {signal: value})]. Distinct values a signal, and the longest time with no
    change in any signal (from the first sample that differs from the one before to the next
    one that does), with when it started."""
    distinct = {s: sorted({v.get(s) for _, v in samples if s in v}) for s in SIGNALS}
    longest, since, start = 0.0, samples[0][0], samples[0][0]
    for (t0, a), (t1, b) in zip(samples, samples[1:]):
        if a != b:
            since = t1
        if t1 - since > longest:
            longest, start = t1 - since, since
    return distinct, longest, start


def measure(url, tokens, every):
    samples = []
    stop = threading.Event()

    def scraper():
        while not stop.is_set():
            t = time.monotonic()
            try:
                samples.append((t, scrape(url)))
            except Exception:  # noqa: BLE001 - a missed scrape is a gap, not a failure
                pass
            stop.wait(max(0.0, every - (time.monotonic() - t)))

    th = threading.Thread(target=scraper)
    th.start()
    time.sleep(2 * every)
    t0 = time.monotonic()
    # A first word of its own: vLLM's prefix cache would otherwise serve a repeated prompt
    # without computing it.
    head = random.choice(WORDS)
    answer = post(url, {"model": "tiny", "prompt": f"{head} " + "1 " * (tokens - 1),
                        "max_tokens": 1})
    elapsed = time.monotonic() - t0
    time.sleep(2 * every)
    stop.set()
    th.join()
    during = [(t - t0, v) for t, v in samples if t0 <= t <= t0 + elapsed]
    distinct, longest, start = summarize(during) if len(during) > 1 else ({}, 0.0, 0.0)
    return {
        "tokens_asked": tokens,
        "prompt_tokens": answer["usage"]["prompt_tokens"],
        "seconds": round(elapsed, 2),
        "scrapes_during": len(during),
        "kv_distinct": [round(x, 5) for x in distinct.get("vllm:kv_cache_usage_perc", [])],
        "running_distinct": distinct.get("vllm:num_requests_running", []),
        "prompt_counter_distinct": distinct.get("vllm:prompt_tokens_total", []),
        "generation_counter_distinct": distinct.get("vllm:generation_tokens_total", []),
        "longest_flat_s": round(longest, 2),
        "longest_flat_from_s": round(start, 2),
        "trace": [(round(t, 2), {k.split(":")[1]: v for k, v in s.items()}) for t, s in during],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("tokens", type=int, nargs="+")
    ap.add_argument("--every", type=float, default=0.25)
    ap.add_argument("--json", action="store_true", help="print the whole trace as JSON")
    args = ap.parse_args()
    for n in args.tokens:
        r = measure(args.url, n, args.every)
        if args.json:
            print(json.dumps(r))
        else:
            trace = r.pop("trace")
            print(json.dumps(r))
            del trace
        time.sleep(1)


if __name__ == "__main__":
    main()
