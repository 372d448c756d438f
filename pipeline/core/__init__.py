"""The lowest layer: what knows nothing of models, stages or options.

Errors and the exit-code contract, this machine (versions, CPU flags), cache-key and lock helpers,
the artifact record and the cache's seal, child processes and interrupts, a user's files and their
digest, progress lines, and how numbers are written for a reader.
"""
