// Replaced by the communicator sources.
