package cli

import (
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// imageTree writes n solid-colour images into three class folders, PNG and
// JPEG, of sizes that differ: image i has red 10*i, so its first feature
// tells which it is. It returns the tree's root.
func imageTree(t *testing.T, n int) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "photos")
	classes := []string{"owl", "cat", "dog"} // sorted: cat, dog, owl
	for i := range n {
		w, h := 3+i%5, 2+i%7
		img := image.NewRGBA(image.Rect(0, 0, w, h))
		for y := range h {
			for x := range w {
				img.Set(x, y, color.RGBA{uint8(10 * i), 128, 40, 255})
			}
		}
		dir := filepath.Join(root, classes[i%3])
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		ext := ".png"
		if i%2 == 1 {
			ext = ".JPG"
		}
		fh, err := os.Create(filepath.Join(dir, fmt.Sprintf("img-%02d%s", i, ext)))
		if err != nil {
			t.Fatal(err)
		}
		if ext == ".png" {
			err = png.Encode(fh, img)
		} else {
			err = jpeg.Encode(fh, img, &jpeg.Options{Quality: 100})
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := fh.Close(); err != nil {
			t.Fatal(err)
		}
	}
	writeTestFile(t, filepath.Join(root, "cat", "notes.txt"), "not an image")
	return root
}

// imageID reads the id imageTree gave an image from its first (red)
// feature.
func imageID(x []float32) int { return int(math.Round(float64(x[0]) * 255 / 10)) }

func TestDataImages(t *testing.T) {
	const n = 24
	root := imageTree(t, n)
	out := filepath.Join(t.TempDir(), "sets")
	r := execute(t, newDataImagesCommand(&app{}), root, "--size", "4x3", "--devices", "3", "--alpha", "0", "--eval-fraction", "0.25", "--out", out)
	if r.err != nil {
		t.Fatal(r.err)
	}
	sets := splitSets(t, out, 3, 3*4*3, 3)
	coversOnce(t, sets, n, imageID)
	for _, d := range sets {
		for i := range d.Len() {
			x := d.Features[i*d.Dim : (i+1)*d.Dim]
			id := imageID(x)
			// Class folders in sorted order: cat 0, dog 1, owl 2.
			if want := [3]uint8{2, 0, 1}[id%3]; d.Labels[i] != want {
				t.Errorf("image %d: label %d, want %d", id, d.Labels[i], want)
			}
			// Channel-major: 12 red values, then 12 green, then 12 blue, each
			// the solid colour whatever the source's size.
			for c, want := range []float64{float64(10*id) / 255, 128.0 / 255, 40.0 / 255} {
				for _, v := range x[c*12 : (c+1)*12] {
					if math.Abs(float64(v)-want) > 4.0/255 {
						t.Fatalf("image %d: channel %d holds %v, want %v", id, c, v, want)
					}
				}
			}
		}
	}
	if got := sets[3].Len(); got != n/4 {
		t.Errorf("eval holds %d images, want %d", got, n/4)
	}
	if b, err := os.ReadFile(filepath.Join(out, classesFile)); err != nil || string(b) != "cat\ndog\nowl\n" {
		t.Errorf("%s: %q, %v", classesFile, b, err)
	}
	if !strings.Contains(r.errOut, "notes.txt") {
		t.Errorf("stderr does not name the skipped file: %q", r.errOut)
	}

	gray := filepath.Join(t.TempDir(), "gray")
	if r := execute(t, newDataImagesCommand(&app{}), root, "--size", "5x2", "--gray", "--devices", "2", "--out", gray); r.err != nil {
		t.Fatal(r.err)
	}
	sets = splitSets(t, gray, 2, 5*2, 3)
	total := 0
	for _, d := range sets {
		total += d.Len()
	}
	if total != n {
		t.Errorf("--gray: %d images written, want %d", total, n)
	}
}

func TestDataImagesRefuses(t *testing.T) {
	// A GIF header declaring 65535x65535 pixels: refused from its header,
	// before anything is decoded.
	bomb := []byte("GIF89a\xff\xff\xff\xff\x00\x00\x00")
	for _, tc := range []struct {
		name, file string
		content    []byte
		want       string
	}{
		{"corrupt", "bad.png", []byte("\x89PNG\r\n\x1a\nnot really"), "not a PNG, JPEG or GIF image"},
		{"bomb", "bomb.gif", bomb, "65535x65535 pixels, more than 16 megapixels"},
		{"truncated", "cut.png", nil, "corrupt png image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := imageTree(t, 6)
			path := filepath.Join(root, "dog", tc.file)
			content := tc.content
			if content == nil {
				b, err := os.ReadFile(filepath.Join(root, "owl", "img-00.png"))
				if err != nil {
					t.Fatal(err)
				}
				content = b[:len(b)-20]
			}
			writeTestFile(t, path, string(content))
			parent := t.TempDir()
			r := execute(t, newDataImagesCommand(&app{}), root, "--size", "4x4", "--devices", "2", "--out", filepath.Join(parent, "out"))
			if !errors.Is(r.err, ErrInput) || !strings.Contains(r.err.Error(), path+": ") || !strings.Contains(r.err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s and %q", r.err, path, tc.want)
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Errorf("left behind: %v", entries)
			}
		})
	}

	root := t.TempDir()
	writeTestFile(t, filepath.Join(root, "only", "a.png"), "")
	if r := execute(t, newDataImagesCommand(&app{}), root, "--size", "4x4", "--devices", "2", "--out", filepath.Join(root, "out")); !errors.Is(r.err, ErrUsage) {
		t.Errorf("one class folder: %v", r.err)
	}
	if r := execute(t, newDataImagesCommand(&app{}), root, "--size", "4by4", "--devices", "2", "--out", filepath.Join(root, "out")); !errors.Is(r.err, ErrUsage) {
		t.Errorf("--size 4by4: %v", r.err)
	}
}

// idxFile is an uncompressed IDX file of unsigned bytes.
func idxFile(dims []int, payload []byte) string {
	b := []byte{0, 0, 8, byte(len(dims))}
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, uint32(d))
	}
	return string(append(b, payload...))
}

func TestDataIDX(t *testing.T) {
	const n, rows, cols = 60, 4, 5
	pixels := make([]byte, n*rows*cols)
	labels := make([]byte, n)
	for i := range n {
		pixels[i*rows*cols] = byte(i) // the id
		pixels[i*rows*cols+1] = 255
		labels[i] = byte(i % 4)
	}
	dir := t.TempDir()
	images := writeTestFile(t, filepath.Join(dir, "images-idx3-ubyte"), idxFile([]int{n, rows, cols}, pixels))
	labelsPath := writeTestFile(t, filepath.Join(dir, "labels-idx1-ubyte"), idxFile([]int{n}, labels))
	out := filepath.Join(dir, "sets")
	r := execute(t, newDataIDXCommand(&app{}), images, labelsPath, "--devices", "3", "--alpha", "1", "--out", out)
	if r.err != nil {
		t.Fatal(r.err)
	}
	sets := splitSets(t, out, 3, rows*cols, 4)
	coversOnce(t, sets, n, func(x []float32) int { return int(math.Round(float64(x[0]) * 255)) })
	for _, d := range sets {
		for i := range d.Len() {
			id := int(math.Round(float64(d.Features[i*d.Dim]) * 255))
			if d.Labels[i] != byte(id%4) || d.Features[i*d.Dim+1] != 1 {
				t.Fatalf("example %d: label %d, pixel 1 %v", id, d.Labels[i], d.Features[i*d.Dim+1])
			}
		}
	}
	if _, err := os.Stat(filepath.Join(out, classesFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("IDX labels have no names, yet %s: %v", classesFile, err)
	}

	// Swapped arguments and a count mismatch are refused, naming the file.
	short := writeTestFile(t, filepath.Join(dir, "short-labels"), idxFile([]int{n - 1}, labels[:n-1]))
	for _, args := range [][]string{{labelsPath, images}, {images, short}} {
		parent := t.TempDir()
		r := execute(t, newDataIDXCommand(&app{}), append(args, "--devices", "2", "--out", filepath.Join(parent, "out"))...)
		if !errors.Is(r.err, ErrInput) || !strings.Contains(r.err.Error(), dir) {
			t.Errorf("%v: %v", args, r.err)
		}
		if entries, _ := os.ReadDir(parent); len(entries) != 0 {
			t.Errorf("left behind: %v", entries)
		}
	}
}
