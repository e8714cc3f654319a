package carbon

import (
	"context"
	"fmt"
	"io"
	"os"
)

// Source is where forecasts come from. Forecasts returns the parsed,
// validated forecasts and the raw bytes they were parsed from, so the
// caller can store the bytes beside the Digest it audits. Implementations
// that fetch over the network live outside pool.
type Source interface {
	Forecasts(ctx context.Context) ([]Forecast, []byte, error)
}

// FileSource reads a forecast file in any layout Parse accepts. It rereads
// the file on every call, so replacing the file (by rename, for an atomic
// switch) updates the forecast.
type FileSource struct {
	Path string
}

// Forecasts reads, bounds and parses the file.
func (s FileSource) Forecasts(ctx context.Context) ([]Forecast, []byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("carbon: read forecast file: %w", err)
	}
	fh, err := os.Open(s.Path)
	if err != nil {
		return nil, nil, fmt.Errorf("carbon: read forecast file: %w", err)
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, MaxInputBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("carbon: read forecast file %s: %w", s.Path, err)
	}
	if len(b) > MaxInputBytes {
		return nil, nil, fmt.Errorf("carbon: read forecast file %s: %w: more than %d bytes", s.Path, ErrTooLarge, MaxInputBytes)
	}
	fs, err := parse(b)
	if err != nil {
		return nil, nil, fmt.Errorf("carbon: read forecast file %s: %w", s.Path, err)
	}
	return fs, b, nil
}
