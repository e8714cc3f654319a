package server

// SetDeviceAuthority stands in for the NATS wiring in tests.
func SetDeviceAuthority(s *Server, a deviceAuthority) { s.natsAuth = a }
