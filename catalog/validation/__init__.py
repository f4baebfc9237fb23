"""Output validation of a candidate release (released values and public metadata only): the checks, Great Expectations and the validation service that runs it."""
