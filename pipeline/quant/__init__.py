"""Quantization: the INT8 sub-recipe (``int8``), its hardware-derived defaults (``defaults``),
the per-layer mixed-precision search (``mixed``), the region search and ``quant=auto``
(``regions``, ``auto``) and the report sections they write (``report``, ``auto_report``)."""
