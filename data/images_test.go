package data

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

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
	writeFile(t, filepath.Join(root, "cat", "notes.txt"), []byte("not an image"))
	writeFile(t, filepath.Join(root, "cat", ".hidden.png"), []byte("left out silently"))
	writeFile(t, filepath.Join(root, "README"), []byte("in no class"))
	if err := os.Mkdir(filepath.Join(root, "dog", "deeper"), 0o700); err != nil {
		t.Fatal(err)
	}
	return root
}

// imageID reads the id imageTree gave an image from its first (red)
// feature.
func imageID(x []float32) int { return int(math.Round(float64(x[0]) * 255 / 10)) }

func TestReadImageFolder(t *testing.T) {
	const n = 24
	root := imageTree(t, n)
	res, err := ReadImageFolder(root, ImageOptions{Width: 4, Height: 3})
	if err != nil {
		t.Fatal(err)
	}
	d := res.Dataset
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if d.Len() != n || d.Dim != 3*4*3 || d.NumClasses != 3 || !slices.Equal(res.Classes, []string{"cat", "dog", "owl"}) {
		t.Fatalf("%d images, dim %d, classes %q", d.Len(), d.Dim, res.Classes)
	}
	wantSkipped := []string{filepath.Join(root, "README"), filepath.Join(root, "cat", "notes.txt"), filepath.Join(root, "dog", "deeper")}
	if !slices.Equal(res.Skipped, wantSkipped) {
		t.Errorf("skipped %q, want %q", res.Skipped, wantSkipped)
	}
	seen := map[int]bool{}
	for i := range d.Len() {
		x := d.Features[i*d.Dim : (i+1)*d.Dim]
		id := imageID(x)
		seen[id] = true
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
	if len(seen) != n {
		t.Errorf("%d distinct images, want %d", len(seen), n)
	}

	gray, err := ReadImageFolder(root, ImageOptions{Width: 5, Height: 2, Gray: true})
	if err != nil {
		t.Fatal(err)
	}
	if g := gray.Dataset; g.Len() != n || g.Dim != 5*2 {
		t.Fatalf("gray: %d images, dim %d", g.Len(), g.Dim)
	}
	for i := range n {
		// Image order is that of the colour read; luma of its solid colour.
		id := imageID(d.Features[i*d.Dim:])
		want := (0.299*float64(10*id) + 0.587*128 + 0.114*40) / 255
		for _, v := range gray.Dataset.Features[i*10 : (i+1)*10] {
			if math.Abs(float64(v)-want) > 4.0/255 {
				t.Fatalf("gray image %d: %v, want %v", id, v, want)
			}
		}
	}
}

// TestResize checks the bilinear weights on a black-to-white gradient and
// that transparency is black.
func TestResize(t *testing.T) {
	img := image.NewNRGBA(image.Rect(5, 5, 7, 6)) // bounds not at the origin
	img.Set(5, 5, color.NRGBA{0, 0, 0, 255})
	img.Set(6, 5, color.NRGBA{255, 255, 255, 255})
	dst := make([]float32, 4)
	resize(dst, img, ImageOptions{Width: 4, Height: 1, Gray: true})
	if want := []float32{0, 0.25, 0.75, 1}; !slices.EqualFunc(dst, want, func(a, b float32) bool { return math.Abs(float64(a-b)) < 1e-6 }) {
		t.Errorf("gradient %v, want %v", dst, want)
	}
	img.Set(6, 5, color.NRGBA{255, 255, 255, 0})
	dst = make([]float32, 3)
	resize(dst, img, ImageOptions{Width: 1, Height: 1})
	if !slices.Equal(dst, []float32{0, 0, 0}) {
		t.Errorf("transparent white and opaque black: %v, want black", dst)
	}
}

func TestReadImageFolderErrors(t *testing.T) {
	// A GIF header declaring 65535x65535 pixels: refused from its header,
	// before anything is decoded.
	bomb := []byte("GIF89a\xff\xff\xff\xff\x00\x00\x00")
	var small strings.Builder
	if err := gif.Encode(&small, image.NewPaletted(image.Rect(0, 0, 40, 30), color.Palette{color.Black, color.White}), nil); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, file string
		content    []byte
		opts       ImageOptions
		want       string
		is         error
	}{
		{"corrupt", "bad.png", []byte("\x89PNG\r\n\x1a\nnot really"), ImageOptions{}, "not a PNG, JPEG or GIF image", ErrImage},
		{"unknown", "text.gif", []byte("plain text"), ImageOptions{}, "not a PNG, JPEG or GIF image (image: unknown format)", ErrImage},
		{"bomb", "bomb.gif", bomb, ImageOptions{}, "gif of 65535x65535 pixels, more than 16 megapixels", ErrTooLarge},
		{"truncated", "cut.png", nil, ImageOptions{}, "corrupt png image", ErrImage},
		{"pixels", "small.gif", []byte(small.String()), ImageOptions{MaxPixels: 1000}, "gif of 40x30 pixels, more than 1000 pixels", ErrTooLarge},
		{"file bytes", "small.gif", []byte(small.String()), ImageOptions{MaxFileBytes: 10}, "bytes, more than 10", ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := imageTree(t, 6)
			// First in the first class, so that it is the file read first.
			path := filepath.Join(root, "cat", "a-"+tc.file)
			content := tc.content
			if content == nil {
				b, err := os.ReadFile(filepath.Join(root, "owl", "img-00.png"))
				if err != nil {
					t.Fatal(err)
				}
				content = b[:len(b)-20]
			}
			writeFile(t, path, content)
			tc.opts.Width, tc.opts.Height = 4, 4
			res, err := ReadImageFolder(root, tc.opts)
			if !errors.Is(err, tc.is) || err == nil || !strings.HasPrefix(err.Error(), path+": ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, %v; want %v naming %s and %q", res, err, tc.is, path, tc.want)
			}
		})
	}

	root := imageTree(t, 6)
	for _, tc := range []struct {
		name string
		dir  string
		opts ImageOptions
		want string
		is   error
	}{
		{"images", root, ImageOptions{Width: 2, Height: 2, MaxImages: 5}, "more than 5 images, or 268435456 feature values", ErrTooLarge},
		{"values", root, ImageOptions{Width: 2, Height: 2, MaxValues: 12 * 3}, "more than 1048576 images, or 36 feature values", ErrTooLarge},
		{"size", root, ImageOptions{Width: 0, Height: 2}, "size 0x2", ErrInvalidArgument},
		{"side", root, ImageOptions{Width: MaxImageSide + 1, Height: 2}, "between 1 and 512", ErrInvalidArgument},
		{"bound", root, ImageOptions{Width: 2, Height: 2, MaxPixels: -1}, "negative bound", ErrInvalidArgument},
		{"one class", filepath.Join(root, "cat"), ImageOptions{Width: 2, Height: 2}, "has 0 sub-folders", ErrInvalidArgument},
		{"missing", filepath.Join(root, "nowhere"), ImageOptions{Width: 2, Height: 2}, "nowhere", os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := ReadImageFolder(tc.dir, tc.opts)
			if !errors.Is(err, tc.is) || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, %v; want %v naming %q", res, err, tc.is, tc.want)
			}
		})
	}

	empty := t.TempDir()
	for _, class := range []string{"a", "b"} {
		writeFile(t, filepath.Join(empty, class, "notes.txt"), []byte("not an image"))
	}
	if _, err := ReadImageFolder(empty, ImageOptions{Width: 2, Height: 2}); !errors.Is(err, ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "hold no .png, .jpg, .jpeg or .gif files") {
		t.Errorf("no images: %v", err)
	}
}
