"""Pure rules of docs/gpuclass.md and docs/gpu-budgets.md: plain values in, plain values out; no
Flask, no I/O, no clock."""
