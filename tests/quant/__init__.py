"""Unit tests of pipeline/quant/, on hand-built onnx.helper graphs."""
