package audit

import (
	"context"
	"fmt"
	"io"
)

// VerifyDataDir verifies the log in a data directory (or database file)
// read-only, with more than an export allows: it checks the query index
// against the signed entries (VerifyIndex), then verifies everything
// stored, as Export writes it for a read-only log, with VerifyExport and
// opts. The report has IndexChecked set.
func VerifyDataDir(ctx context.Context, dir string, opts ...VerifyOption) (Report, error) {
	lg, err := OpenReadOnly(ctx, dir)
	if err != nil {
		return Report{}, fmt.Errorf("audit: verify %s: %w", dir, err)
	}
	defer lg.Close()
	if err := lg.VerifyIndex(ctx); err != nil {
		return Report{}, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(lg.Export(ctx, pw)) }()
	rep, err := VerifyExport(pr, opts...)
	// Unblock the writer if verification stopped early.
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return rep, err
	}
	rep.IndexChecked = true
	return rep, nil
}
