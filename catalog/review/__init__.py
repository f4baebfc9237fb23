"""Audited review: the review policy a release registers with, and the decisions (approve, reject, publish) recorded in the catalog."""
