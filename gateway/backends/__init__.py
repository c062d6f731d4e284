"""Engine clients: how the gateway reaches an inference engine (base.EngineClient), and the backends."""
