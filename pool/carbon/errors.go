package carbon

import "errors"

// Sentinel errors. Every error from this package wraps one of them (or an
// I/O error from a Source), so the server can map failures to API status
// codes with errors.Is.
var (
	// ErrInvalidForecast reports forecast data that breaks a bound: an
	// unparsable or out-of-range timestamp, an intensity that is not finite
	// or outside [0, MaxIntensity], points out of order or overlapping, a
	// bad zone name, unsupported units.
	ErrInvalidForecast = errors.New("invalid carbon forecast")
	// ErrTooLarge reports forecast input over MaxInputBytes, MaxZones or
	// MaxPoints.
	ErrTooLarge = errors.New("carbon forecast too large")
	// ErrUnknownFormat reports bytes that are neither Carbon Aware SDK nor
	// WattTime forecast JSON.
	ErrUnknownFormat = errors.New("unknown carbon forecast format")
	// ErrInvalidRequest reports a placement request or metered run out of
	// range: a missing start, a non-positive duration, a power that is not a
	// finite positive number, a zone without a forecast.
	ErrInvalidRequest = errors.New("invalid carbon placement request")
	// ErrInfeasible reports a job that cannot finish by its deadline even if
	// started at once.
	ErrInfeasible = errors.New("job cannot finish by its deadline")
	// ErrNoCoverage reports that no forecast covers a whole window the job
	// could run in; a plan never prices time the forecast does not cover.
	ErrNoCoverage = errors.New("no forecast covers the window")
)
