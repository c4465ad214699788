"""Metacontroller hooks for GPUClass: capacity status and vGPU license copies."""

__version__ = "0.1.0"
