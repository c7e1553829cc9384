// Replaced by the transport implementation.
