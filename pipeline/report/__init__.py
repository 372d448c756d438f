"""What a run tells the user: the run report (``run``) and its plots (``plots``)."""
