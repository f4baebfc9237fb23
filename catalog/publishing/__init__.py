"""What a release publishes and how it is verified: the manifest, the artifacts, the tables, the audit report and its charts, and synthetic data from released tables."""
