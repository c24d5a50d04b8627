import http.client, json, random, statistics, subprocess, sys, time, os, socket
S, M = sys.argv[1], sys.argv[2]
pin = sys.argv[3] if len(sys.argv) > 3 else None
with socket.socket() as s: s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
argv = [S, "--host", "127.0.0.1", "--port", str(port), "-m", M, "-c", "1100", "-np", "1", "-t", "1", "-tb", "1", "--no-webui"]
if pin: argv = ["taskset", "-c", pin] + argv
p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def post(body, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    return c.getresponse()
for _ in range(200):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2); c.request("GET", "/health")
        if c.getresponse().status == 200: break
    except OSError: pass
    time.sleep(0.1)
rng = random.Random(3)
reqs = []
for k in range(30):
    prompt = [rng.randrange(200, 30000) for _ in range(int(os.environ.get("CTX", 128)))]
    post({"prompt": prompt, "n_predict": 0, "cache_prompt": True}).read()
    r = post({"prompt": prompt, "n_predict": 24, "top_k": 1, "cache_prompt": True, "stream": True, "return_tokens": True})
    ts = []
    def flt():
        f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
        st = [l for l in open("/proc/stat") if l.startswith("cpu1 ")][0].split()
        return int(f[7]), int(f[9]), int(st[8])
    f0 = flt()
    for line in r:
        if line.startswith(b"data: "):
            ts.append(time.perf_counter())
    f1 = flt()
    print("minflt", f1[0]-f0[0], "majflt", f1[1]-f0[1], "steal_cpu1_jiffies", f1[2]-f0[2])
    gaps = [1000*(b-a) for a, b in zip(ts, ts[1:])]
    reqs.append(gaps)
    print(" ".join(f"{g:.0f}" for g in gaps)); print(f"req {k}: total {sum(gaps):.0f} ms, median gap {statistics.median(gaps):.1f}, min {min(gaps):.1f}, max {max(gaps):.1f}", flush=True)
p.terminate()
tot = [sum(g) for g in reqs]
print("total sd %.2f%%" % (100*statistics.stdev(tot)/statistics.mean(tot)))
meds = [statistics.median(g) for g in reqs]
print("median-gap sd %.2f%%" % (100*statistics.stdev(meds)/statistics.mean(meds)))
