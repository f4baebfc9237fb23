"""Planning a release from public information only: the planner, the estimators, the strategy store, predicted memory, and the published strategy of local-model collections."""
