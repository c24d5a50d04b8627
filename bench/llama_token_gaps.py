"""llama-server's decode token by token (#38): one server (one thread, pinned to a vCPU), 30 streamed
continuations of random prompts of CTX tokens (the prompt prefilled untimed first), each token's arrival
time kept; per request the gaps between tokens, the server's page faults and the vCPU's steal. Slow spells
that span tokens, stalls of one token, faults and steal then each show for what they are.

    CTX=512 python bench/llama_token_gaps.py <build>/bin/llama-server qwen2.5-coder-0.5b.gguf [VCPU]

Nothing else may run on the box meanwhile. Standard library only.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from llama_turns import Server  # bench/ is the script's path


def main() -> None:
    server, model = sys.argv[1], sys.argv[2]
    cpu = sys.argv[3] if len(sys.argv) > 3 else "1"
    ctx = int(os.environ.get("CTX", "128"))
    srv = Server(server, model, 2 * ctx + 64, int(cpu))  # started, pinned, healthy
    proc, port = srv.proc, srv.port

    def post(body: dict) -> http.client.HTTPResponse:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        return c.getresponse()

    def counters() -> tuple[int, int, int]:
        stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        vcpu = next(
            line for line in Path("/proc/stat").read_text().splitlines() if line.startswith(f"cpu{cpu} ")
        ).split()
        return int(stat[7]), int(stat[9]), int(vcpu[8])  # minflt, majflt, steal (jiffies)

    try:
        rng = random.Random(3)
        totals = []
        for k in range(30):
            prompt = [rng.randrange(200, 30000) for _ in range(ctx)]
            post({"prompt": prompt, "n_predict": 0, "cache_prompt": True}).read()
            before = counters()
            r = post({"prompt": prompt, "n_predict": 24, "top_k": 1, "cache_prompt": True, "stream": True})
            arrived = [time.perf_counter() for line in r if line.startswith(b"data: ")]
            after = counters()
            gaps = [1000 * (b - a) for a, b in itertools.pairwise(arrived)]
            totals.append(sum(gaps))
            print(" ".join(f"{g:.0f}" for g in gaps))
            print(
                f"req {k}: total {sum(gaps):.0f} ms, median gap {statistics.median(gaps):.1f}, "
                f"max {max(gaps):.1f}; minflt {after[0] - before[0]} majflt {after[1] - before[1]} "
                f"steal {after[2] - before[2]} jiffies",
                flush=True,
            )
        print(f"request total sd {100 * statistics.stdev(totals) / statistics.mean(totals):.2f}%")
    finally:
        srv.close()


if __name__ == "__main__":
    main()
