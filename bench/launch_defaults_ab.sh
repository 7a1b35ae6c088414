#!/bin/bash
# Interleaved A/B of the CPU launch defaults, AR only, 12 requests x 128 tokens each, T = 0:
# A = the README command before 935235a (SGLang's auto dtype = fp16, SGLang's own thread binding: 2 threads)
# B = the same command with the new CPU defaults (--dtype float32, OMP_NUM_THREADS=1)
cd "$(dirname "$0")/.."
SGLANG_USE_CPU_ENGINE=1 env -u OMP_NUM_THREADS .venv/bin/python -m sglang.launch_server --model-path models/target --device cpu --port 31781 --attention-backend torch_native --max-total-tokens 4096 --disable-cuda-graph --sleep-on-idle > /tmp/sglang_ssd_launch_ab_A.log 2>&1 &
sleep 1
SGLANG_USE_CPU_ENGINE=1 env -u OMP_NUM_THREADS .venv/bin/python -m sglang_ssd.launch_server --model-path models/target --device cpu --port 31782 > /tmp/sglang_ssd_launch_ab_B.log 2>&1 &
for p in 31781 31782; do for i in $(seq 1 150); do curl -s localhost:$p/health >/dev/null && break; sleep 2; done; done
python3 - <<'PY'
import json, time, urllib.request, statistics
prompts=["Write a detailed essay about the history of the Roman empire and its fall.",
 "Explain how a hash table works, with an example in Python.",
 "What are the main causes of inflation? Give three examples.",
 "Describe a walk through a forest in autumn."]
def gen(port, text, n):
    req=urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps({"text":text,"sampling_params":{"max_new_tokens":n,"temperature":0,"ignore_eos":True}}).encode(), headers={"Content-Type":"application/json"})
    t=time.perf_counter(); d=json.load(urllib.request.urlopen(req)); dt=time.perf_counter()-t
    return d["meta_info"]["completion_tokens"]/dt
for p in (31781,31782): gen(p,"hello",8)
res={"A_fp16_2threads":[], "B_fp32_1thread":[]}
for r in range(3):
    for t in prompts:
        res["A_fp16_2threads"].append(gen(31781,t,128))
        res["B_fp32_1thread"].append(gen(31782,t,128))
out={k:{"median_tok_s":round(statistics.median(v),2),"runs":[round(x,2) for x in v]} for k,v in res.items()}
out["B_over_A"]=round(out["B_fp32_1thread"]["median_tok_s"]/out["A_fp16_2threads"]["median_tok_s"],3)
print(json.dumps(out,indent=1))
json.dump(out,open("bench/results/launch_defaults/ab.json","w"),indent=1)
PY
grep -a "KV Cache is allocated\|CPU linear" /tmp/sglang_ssd_launch_ab_A.log /tmp/sglang_ssd_launch_ab_B.log | cut -c1-160
pkill -f "port 3178"; pkill -f "sglang::"; sleep 2
