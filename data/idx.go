package data

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

const (
	// MaxIDXBytes is the largest IDX payload ReadIDX accepts.
	MaxIDXBytes = 1 << 30

	// maxIDXDims bounds the rank ReadIDX accepts; MNIST uses 1 (labels) and
	// 3 (images).
	maxIDXDims = 4

	idxTypeUbyte = 0x08
)

// ReadIDX reads one IDX file (the format MNIST is distributed in) holding
// unsigned bytes, gzip-compressed or not, and returns its dimensions and
// row-major payload. The magic number must be 0x000008NN where NN, the rank,
// is between 1 and 4: 0x00000801 for label files, 0x00000803 for image files.
// Payloads larger than [MaxIDXBytes] are refused before any is read, and data
// after the payload is an error.
func ReadIDX(r io.Reader) (dims []int, data []byte, err error) {
	dims, data, err = readIDX(r, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("data: read idx: %w", err)
	}
	return dims, data, nil
}

// readIDX is ReadIDX without the operation prefix. A non-nil want must
// equal the dimensions, which are checked before the payload is read.
func readIDX(r io.Reader, want []int) (dims []int, data []byte, err error) {
	br := bufio.NewReader(r)
	var src io.Reader = br
	if p, _ := br.Peek(2); len(p) == 2 && p[0] == 0x1f && p[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip: %w", idxReadErr(err))
		}
		defer zr.Close()
		src = zr
	}

	var magic [4]byte
	if _, err := io.ReadFull(src, magic[:]); err != nil {
		return nil, nil, fmt.Errorf("magic: %w", idxReadErr(err))
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, nil, fmt.Errorf("bad magic 0x%08x: %w", binary.BigEndian.Uint32(magic[:]), ErrIDX)
	}
	if magic[2] != idxTypeUbyte {
		return nil, nil, fmt.Errorf("element type 0x%02x is not unsigned byte (0x08): %w", magic[2], ErrIDX)
	}
	rank := int(magic[3])
	if rank < 1 || rank > maxIDXDims {
		return nil, nil, fmt.Errorf("rank %d outside [1, %d]: %w", rank, maxIDXDims, ErrIDX)
	}

	hdr := make([]byte, 4*rank)
	if _, err := io.ReadFull(src, hdr); err != nil {
		return nil, nil, fmt.Errorf("dimensions: %w", idxReadErr(err))
	}
	dims = make([]int, rank)
	size := 1
	for i := range dims {
		d := int(binary.BigEndian.Uint32(hdr[4*i:]))
		// Checked per factor so the product can never overflow.
		if d > MaxIDXBytes || (d > 0 && size > MaxIDXBytes/d) {
			return nil, nil, fmt.Errorf("dimensions %v exceed %d bytes: %w",
				dimsOf(hdr), MaxIDXBytes, ErrTooLarge)
		}
		dims[i] = d
		size *= d
	}
	if want != nil && !slices.Equal(dims, want) {
		return nil, nil, fmt.Errorf("dimensions %v, want %v: %w", dims, want, ErrIDX)
	}

	data, err = readExact(src, size)
	if err != nil {
		return nil, nil, fmt.Errorf("payload of %d bytes: %w", size, err)
	}
	// Reading past the payload also makes gzip verify its checksum.
	var extra [1]byte
	switch n, err := io.ReadFull(src, extra[:]); {
	case n > 0:
		return nil, nil, fmt.Errorf("trailing data after %d-byte payload: %w", size, ErrIDX)
	case err != io.EOF:
		return nil, nil, fmt.Errorf("after payload: %w", idxReadErr(err))
	}
	return dims, data, nil
}

// readExact reads exactly n bytes, growing its buffer as data arrives so a
// short input that declares a huge size cannot force a huge allocation.
func readExact(r io.Reader, n int) ([]byte, error) {
	const first = 64 << 10
	buf := make([]byte, 0, min(n, first))
	for len(buf) < n {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(n, 2*cap(buf)))
			copy(grown, buf)
			buf = grown
		}
		m, err := io.ReadFull(r, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err != nil {
			return nil, fmt.Errorf("got %d bytes: %w", len(buf), idxReadErr(err))
		}
	}
	return buf, nil
}

// idxReadErr classifies a read error: early EOF is truncation and a corrupt
// gzip stream is malformed IDX data; anything else (I/O) passes through.
func idxReadErr(err error) error {
	var corrupt flate.CorruptInputError
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ErrTruncated
	case errors.As(err, &corrupt), errors.Is(err, gzip.ErrChecksum), errors.Is(err, gzip.ErrHeader):
		return fmt.Errorf("%w: %w", ErrIDX, err)
	}
	return err
}

func dimsOf(hdr []byte) []uint32 {
	out := make([]uint32, len(hdr)/4)
	for i := range out {
		out[i] = binary.BigEndian.Uint32(hdr[4*i:])
	}
	return out
}
