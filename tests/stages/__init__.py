"""One test file per stage of pipeline/stages/, each on tiny graphs: what that stage guarantees."""
