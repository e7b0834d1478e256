import sys
sys.argv = ["compile_offline.py", "--resources"]
import benchmarks.compile_offline as co
co.DESIGN_SETS = [dict(s.split("=") for s in line.split(",")) for line in [
 "verify=token-loop,flush-verify=flush-apart,commit=token-loop,commit-layers=one-launch,commit-context=conv-apart",
 "verify=one-pass,flush-verify=token-loop-token-by-token,commit=fold-in-tile,commit-layers=one-launch,commit-context=plan-in-commit",
 "verify=two-kernels,flush-verify=two-kernels,commit=fold-operand-once,commit-layers=per-layer,commit-context=conv-apart",
 "verify=two-kernels,flush-verify=two-kernels,commit=fold-operand-once-wide,commit-layers=per-layer,commit-context=plan-in-commit",
 "verify=two-kernels,flush-verify=two-kernels,commit=fold-operand-once,commit-layers=one-launch,commit-context=plan-in-commit"]]
co.main()
