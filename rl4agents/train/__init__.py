"""Training loop pieces: metric writers, train steps, and the driver."""
