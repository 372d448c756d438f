"""Unit tests of pipeline/report/."""
