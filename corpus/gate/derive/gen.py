"""Write cases/NNN_name.json from cases.py: inputs, the expected decision and the working.
Each case states its intended verdict (and rule or band); a mismatch with the calculator is
reported, never silently written over. Run: python3 corpus/gate/derive/gen.py"""
import json, os, sys
sys.path.insert(0, os.path.dirname(__file__))
from calc import derive
from cases import CASES
outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cases")
os.makedirs(outdir, exist_ok=True)
bad = 0
for i, c in enumerate(CASES, 1):
    exp, arith, dbg = derive(c)
    want = c.pop("_expect")
    for k, v in want.items():
        if exp.get(k) != v:
            print(f"INTENT MISMATCH {c['name']}: {k} want {v} got {exp.get(k)} (score {dbg['score']:.6f})"); bad += 1
    for k in ("rule", "band"):
        if k not in want and exp[k] is not None:
            print(f"INTENT MISMATCH {c['name']}: unexpected {k} {exp[k]} (score {dbg['score']:.6f})"); bad += 1
    c["expected"] = exp
    c["arithmetic"] = arith
    fn = f"{i:03d}_{c['name']}.json"
    with open(os.path.join(outdir, fn), "w") as f:
        json.dump(c, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(f"{fn}: {exp['verdict']} {exp['rule'] or exp['band'] or ''} score {dbg['score']:.6f} findings {[x['code'] for x in exp['findings']]}")
print("cases:", len(CASES), "intent mismatches:", bad)
