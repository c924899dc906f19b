"""Running graphs: feed checking, symbol binding and the executors."""
