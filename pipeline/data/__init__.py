"""A user's own data: the `data=` group's schema (``spec``), reading it through ``datasets`` with a
content digest and disjoint splits (``load``), and declarative image preprocessing (``images``)."""
