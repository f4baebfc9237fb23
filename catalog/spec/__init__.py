"""The release spec: pydantic models for the YAML a release engineer writes (the contract).

Everything in a spec is public: the domain, bins and workload never come from the data.  Every
invalid spec fails here, before any work, with a :class:`~catalog.errors.SpecError` whose message
names the field, the value and the rule.

* :mod:`catalog.spec.limits`: the supported sizes and ranges, and the privacy-parameter rules;
* :mod:`catalog.spec.domain`: the domain attributes (integer ranges, numeric bins, categories);
* :mod:`catalog.spec.sections`: the dataset, privacy unit, workload item and review sections;
* :mod:`catalog.spec.model`: :class:`~catalog.spec.model.ReleaseSpec` (cross-field rules and
  fingerprints) and the workload it implies (expansion, derived items, table sizes);
* :mod:`catalog.spec.load`: reading a YAML file, and refusing a release too large to run."""
