// Package carbon is Fleetlearn's carbon-aware placement math: per-zone
// carbon-intensity forecasts, the choice of start time and zone that
// minimises a deadline job's expected emissions, and the emissions of a
// metered run.
//
// Like the rest of pool it is pure. It parses forecast bytes (the Green
// Software Foundation Carbon Aware SDK's EmissionsForecast JSON, or
// WattTime's v3 /forecast response) and reads forecast files through a
// Source, but it never fetches anything: a provider URL is the server's
// business, behind the same Source interface.
//
// Why these rules:
//
//   - A forecast is a step function: each point holds its intensity for its
//     whole duration. Points are sorted and never overlap; gaps are allowed
//     and mean "unknown", and no window that touches a gap is ever chosen or
//     priced. Guessing across a gap would let a stale or partial forecast
//     steer jobs.
//   - The expected emissions of a start s are the integral of the step
//     function over [s, s+D], a continuous function of s that is linear
//     between the starts where s or s+D crosses a point boundary. Its minimum
//     over an interval is therefore at one of those starts or at an end of
//     the interval, so Plan tries exactly: every boundary b, every b-D, the
//     earliest start and the latest start. That is exact, not a grid search.
//   - Ties (costs within one part in 10^9) go to the earliest start, then to
//     the zone name, so a plan is a function of its inputs.
//   - The digest that audits a decision is over the parsed points, not the
//     bytes, so the same forecast saved with other whitespace, field order or
//     layout digests alike.
package carbon
