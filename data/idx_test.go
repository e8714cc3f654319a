package data

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
	"testing/iotest"
)

func TestReadIDX(t *testing.T) {
	labels := idxBytes(0x00000801, []uint32{3}, []byte{7, 2, 1})
	images := idxBytes(0x00000803, []uint32{2, 2, 2}, []byte{0, 1, 2, 3, 4, 5, 6, 255})
	gzLabels := gzipBytes(t, labels)
	badCRC := slices.Clone(gzLabels)
	badCRC[len(badCRC)-8] ^= 0xff // first byte of the CRC-32 trailer

	tests := []struct {
		name     string
		in       []byte
		wantDims []int
		wantData []byte
		wantErr  error
	}{
		{name: "labels", in: labels, wantDims: []int{3}, wantData: []byte{7, 2, 1}},
		{name: "images", in: images, wantDims: []int{2, 2, 2}, wantData: []byte{0, 1, 2, 3, 4, 5, 6, 255}},
		{name: "gzip labels", in: gzLabels, wantDims: []int{3}, wantData: []byte{7, 2, 1}},
		{name: "gzip images", in: gzipBytes(t, images), wantDims: []int{2, 2, 2}, wantData: []byte{0, 1, 2, 3, 4, 5, 6, 255}},
		{name: "rank 4", in: idxBytes(0x00000804, []uint32{1, 1, 1, 2}, []byte{1, 2}), wantDims: []int{1, 1, 1, 2}, wantData: []byte{1, 2}},
		{name: "zero dim", in: idxBytes(0x00000801, []uint32{0}, nil), wantDims: []int{0}, wantData: []byte{}},
		{name: "empty", in: nil, wantErr: ErrTruncated},
		{name: "short magic", in: []byte{0, 0, 8}, wantErr: ErrTruncated},
		{name: "bad magic high bytes", in: idxBytes(0x01000801, []uint32{3}, []byte{1, 2, 3}), wantErr: ErrIDX},
		{name: "gzip short header", in: []byte{0x1f, 0x8b, 8, 0}, wantErr: ErrTruncated},
		{name: "gzip bad header", in: []byte{0x1f, 0x8b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, wantErr: ErrIDX},
		{name: "signed byte type", in: idxBytes(0x00000901, []uint32{1}, []byte{1}), wantErr: ErrIDX},
		{name: "float type", in: idxBytes(0x00000d01, []uint32{1}, []byte{1, 2, 3, 4}), wantErr: ErrIDX},
		{name: "rank 0", in: idxBytes(0x00000800, nil, nil), wantErr: ErrIDX},
		{name: "rank 5", in: idxBytes(0x00000805, []uint32{1, 1, 1, 1, 1}, []byte{1}), wantErr: ErrIDX},
		{name: "truncated dims", in: idxBytes(0x00000803, []uint32{2, 2}, nil), wantErr: ErrTruncated},
		{name: "truncated payload", in: idxBytes(0x00000803, []uint32{2, 2, 2}, []byte{1, 2, 3}), wantErr: ErrTruncated},
		{name: "huge declared, tiny payload", in: idxBytes(0x00000801, []uint32{MaxIDXBytes}, []byte{1}), wantErr: ErrTruncated},
		{name: "trailing data", in: append(slices.Clone(labels), 9), wantErr: ErrIDX},
		{name: "oversize single dim", in: idxBytes(0x00000801, []uint32{MaxIDXBytes + 1}, nil), wantErr: ErrTooLarge},
		{name: "oversize max dim", in: idxBytes(0x00000801, []uint32{0xffffffff}, nil), wantErr: ErrTooLarge},
		{name: "oversize product", in: idxBytes(0x00000803, []uint32{1 << 15, 1 << 15, 2}, nil), wantErr: ErrTooLarge},
		{name: "oversize product overflowing", in: idxBytes(0x00000804, []uint32{1 << 30, 1 << 30, 1 << 30, 1 << 30}, nil), wantErr: ErrTooLarge},
		{name: "oversize after zero dim", in: idxBytes(0x00000802, []uint32{0, 0xffffffff}, nil), wantErr: ErrTooLarge},
		{name: "gzip truncated", in: gzLabels[:len(gzLabels)-5], wantErr: ErrTruncated},
		{name: "gzip header only", in: gzLabels[:10], wantErr: ErrTruncated},
		{name: "gzip bad checksum", in: badCRC, wantErr: ErrIDX},
		{name: "gzip trailing payload", in: gzipBytes(t, append(slices.Clone(labels), 1)), wantErr: ErrIDX},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dims, data, err := ReadIDX(bytes.NewReader(tt.in))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ReadIDX error = %v, want %v", err, tt.wantErr)
				}
				if dims != nil || data != nil {
					t.Errorf("ReadIDX returned data alongside error %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ReadIDX: %v", err)
			}
			if !slices.Equal(dims, tt.wantDims) || !bytes.Equal(data, tt.wantData) {
				t.Errorf("ReadIDX = %v, %v; want %v, %v", dims, data, tt.wantDims, tt.wantData)
			}
		})
	}
}

// A reader that returns one byte at a time exercises the buffered paths.
func TestReadIDXOneByteReader(t *testing.T) {
	payload := make([]byte, 200<<10) // larger than readExact's first buffer
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	for _, in := range [][]byte{
		idxBytes(0x00000801, []uint32{uint32(len(payload))}, payload),
		gzipBytes(t, idxBytes(0x00000801, []uint32{uint32(len(payload))}, payload)),
	} {
		dims, data, err := ReadIDX(iotest.OneByteReader(bytes.NewReader(in)))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(dims, []int{len(payload)}) || !bytes.Equal(data, payload) {
			t.Fatalf("ReadIDX mismatch: dims %v, %d bytes", dims, len(data))
		}
	}
}

func TestReadIDXReaderError(t *testing.T) {
	boom := errors.New("disk on fire")
	in := idxBytes(0x00000801, []uint32{10}, []byte{1, 2})
	_, _, err := ReadIDX(io.MultiReader(bytes.NewReader(in), iotest.ErrReader(boom)))
	if !errors.Is(err, boom) {
		t.Fatalf("ReadIDX error = %v, want %v", err, boom)
	}
}

func FuzzReadIDX(f *testing.F) {
	f.Add(idxBytes(0x00000801, []uint32{3}, []byte{7, 2, 1}))
	f.Add(idxBytes(0x00000803, []uint32{1, 2, 2}, []byte{0, 64, 128, 255}))
	f.Add(gzipBytes(f, idxBytes(0x00000801, []uint32{2}, []byte{4, 5})))
	f.Add(idxBytes(0x00000801, []uint32{MaxIDXBytes}, nil))
	f.Add([]byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, in []byte) {
		dims, data, err := ReadIDX(bytes.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrIDX) && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if len(dims) < 1 || len(dims) > maxIDXDims {
			t.Fatalf("rank %d", len(dims))
		}
		size := 1
		raw := make([]uint32, len(dims))
		for i, d := range dims {
			size *= d
			raw[i] = uint32(d)
		}
		if size != len(data) || size > MaxIDXBytes {
			t.Fatalf("dims %v but %d bytes", dims, len(data))
		}
		// Uncompressed input that parses must be exactly header + payload.
		if len(in) < 2 || in[0] != 0x1f || in[1] != 0x8b {
			if !bytes.Equal(idxBytes(0x800|uint32(len(dims)), raw, data), in) {
				t.Fatalf("re-encoding differs from input")
			}
		}
	})
}
