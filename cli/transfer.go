package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
)

// maxPages bounds a listing, in case a server keeps returning page tokens.
const maxPages = 10000

// listAll fetches every page of a listing.
func listAll[T any](ctx context.Context, fetch func(ctx context.Context, token string) ([]T, string, error)) ([]T, error) {
	var all []T
	token := ""
	for range maxPages {
		items, next, err := fetch(ctx, token)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		if next == token {
			return nil, fmt.Errorf("%w: server repeated page token %q", ErrProtocol, next)
		}
		token = next
	}
	return nil, fmt.Errorf("%w: listing has more than %d pages", ErrProtocol, maxPages)
}

// localFile is an open file to upload, with its size and digest.
type localFile struct {
	f      *os.File
	size   int64
	sha256 string
}

// openUpload opens path and hashes it. The caller closes the file.
func openUpload(path string) (*localFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%w: %s is not a regular file", ErrInput, path)
	}
	if err == nil && fi.Size() == 0 {
		err = fmt.Errorf("%w: %s is empty", ErrInput, path)
	}
	h := sha256.New()
	var n int64
	if err == nil {
		n, err = io.Copy(h, f)
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &localFile{f: f, size: n, sha256: hex.EncodeToString(h.Sum(nil))}, nil
}
