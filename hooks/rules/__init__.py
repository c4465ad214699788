"""Pure rules of gpuclass-api.md: plain values in, plain values out; no Flask, no I/O, no clock."""
