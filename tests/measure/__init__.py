"""Unit tests of pipeline/measure/."""
