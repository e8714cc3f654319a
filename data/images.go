package data

// A folder of labelled images, one sub-folder per class, as image datasets
// are commonly shared. The folder may come from anyone: the bounds hold
// before anything large is allocated, and a file's pixel count is checked
// on its header before it is decoded, so a small file declaring a huge
// image cannot exhaust memory.

import (
	"bytes"
	"fmt"
	"image"
	_ "image/gif" // decoders image.Decode dispatches to
	_ "image/jpeg"
	_ "image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// MaxImageSide bounds ImageOptions.Width and Height, which keeps one
// example's features within 3 x 512 x 512 values.
const MaxImageSide = 512

// Default bounds of ReadImageFolder; see also DefaultMaxFeatureValues.
const (
	DefaultMaxImages     = 1 << 20
	DefaultMaxImageBytes = 32 << 20 // one file
	DefaultMaxPixels     = 1 << 24  // width x height of one source image
)

// imageExts are the file name extensions ReadImageFolder reads, lower case.
var imageExts = map[string]bool{".png": true, ".jpg": true, ".jpeg": true, ".gif": true}

// ImageOptions say the shape ReadImageFolder resizes images to, and bound
// what it reads. Zero bounds take the defaults.
type ImageOptions struct {
	// Width and Height are each between 1 and MaxImageSide.
	Width, Height int
	// Gray makes one feature per pixel, its luma, instead of three (red,
	// green and blue).
	Gray bool

	// MaxImages bounds the images read, MaxFileBytes each file's size,
	// MaxPixels each source image's width x height (checked on its header),
	// and MaxValues the feature values in all; more is ErrTooLarge.
	MaxImages    int
	MaxFileBytes int64
	MaxPixels    int
	MaxValues    int
}

func (o *ImageOptions) fill() error {
	if o.Width < 1 || o.Height < 1 || o.Width > MaxImageSide || o.Height > MaxImageSide {
		return fmt.Errorf("size %dx%d: each side must be between 1 and %d: %w", o.Width, o.Height, MaxImageSide, ErrInvalidArgument)
	}
	if o.MaxImages < 0 || o.MaxFileBytes < 0 || o.MaxPixels < 0 || o.MaxValues < 0 {
		return fmt.Errorf("negative bound (max images %d, max file bytes %d, max pixels %d, max values %d): %w",
			o.MaxImages, o.MaxFileBytes, o.MaxPixels, o.MaxValues, ErrInvalidArgument)
	}
	if o.MaxImages == 0 {
		o.MaxImages = DefaultMaxImages
	}
	if o.MaxFileBytes == 0 {
		o.MaxFileBytes = DefaultMaxImageBytes
	}
	if o.MaxPixels == 0 {
		o.MaxPixels = DefaultMaxPixels
	}
	if o.MaxValues == 0 {
		o.MaxValues = DefaultMaxFeatureValues
	}
	return nil
}

func (o ImageOptions) channels() int {
	if o.Gray {
		return 1
	}
	return 3
}

func (o ImageOptions) dim() int { return o.channels() * o.Width * o.Height }

// ImageDataset is what ReadImageFolder read.
type ImageDataset struct {
	// Dataset holds one example per image: classes in order, and the
	// images of each in name order.
	Dataset *Dataset
	// Classes are the class folders' names by label, in sorted order.
	Classes []string
	// Skipped are the paths of files in dir and of entries in the class
	// folders that are not images (by extension) or not regular files,
	// such as deeper folders. Names starting with '.' are left out
	// silently.
	Skipped []string
}

// ReadImageFolder reads dir/CLASS/FILE: each sub-folder of dir is a class,
// numbered in sorted name order, at least two of them, and its files ending
// in .png, .jpg, .jpeg or .gif (any case), in name order, are that class's
// examples, decoded with the standard library (a GIF's first frame).
//
// Each image is resized to Width x Height by bilinear interpolation, pixel
// centres aligned and edges clamped, and its features are the pixels
// scaled to [0, 1], channel-major as PyTorch stores images: the whole red
// plane, then green, then blue, each row after row; with Gray one plane of
// BT.601 luma. Transparent pixels count as black.
//
// A folder that is not one of classes holding images is
// ErrInvalidArgument; a file that does not decode ErrImage, with its path
// in the message; anything past a bound ErrTooLarge.
func ReadImageFolder(dir string, opts ImageOptions) (*ImageDataset, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	top, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var classes, skipped []string
	for _, e := range top {
		switch {
		case strings.HasPrefix(e.Name(), "."):
		case e.IsDir():
			classes = append(classes, e.Name())
		default:
			skipped = append(skipped, filepath.Join(dir, e.Name()))
		}
	}
	if len(classes) < 2 {
		return nil, fmt.Errorf("%s has %d sub-folders: it needs one per class, at least two, each holding that class's images: %w",
			dir, len(classes), ErrInvalidArgument)
	}
	if len(classes) > MaxClasses {
		return nil, fmt.Errorf("%s: %d class folders, more than %d: %w", dir, len(classes), MaxClasses, ErrTooLarge)
	}
	dim := opts.dim()
	set := &Dataset{Dim: dim, NumClasses: len(classes)}
	for k, class := range classes {
		files, err := os.ReadDir(filepath.Join(dir, class))
		if err != nil {
			return nil, err
		}
		for _, e := range files {
			path := filepath.Join(dir, class, e.Name())
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			if !e.Type().IsRegular() || !imageExts[strings.ToLower(filepath.Ext(e.Name()))] {
				skipped = append(skipped, path)
				continue
			}
			if set.Len() == opts.MaxImages || (set.Len()+1)*dim > opts.MaxValues {
				return nil, fmt.Errorf("%s: more than %d images, or %d feature values, in all: %w", dir, opts.MaxImages, opts.MaxValues, ErrTooLarge)
			}
			n := len(set.Features)
			set.Features = append(set.Features, make([]float32, dim)...)
			if err := loadImage(set.Features[n:], path, opts); err != nil {
				return nil, err
			}
			set.Labels = append(set.Labels, uint8(k))
		}
	}
	if set.Len() == 0 {
		return nil, fmt.Errorf("the class folders of %s hold no .png, .jpg, .jpeg or .gif files: %w", dir, ErrInvalidArgument)
	}
	return &ImageDataset{Dataset: set, Classes: classes, Skipped: skipped}, nil
}

// loadImage decodes the image at path and writes its resized pixels to
// dst, which holds o.dim() values.
func loadImage(dst []float32, path string, o ImageOptions) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > o.MaxFileBytes {
		return fmt.Errorf("%s: %d bytes, more than %d: %w", path, fi.Size(), o.MaxFileBytes, ErrTooLarge)
	}
	// The size is checked again on what is read, as the file may grow.
	b, err := io.ReadAll(io.LimitReader(fh, o.MaxFileBytes+1))
	if err != nil {
		return err
	}
	if int64(len(b)) > o.MaxFileBytes {
		return fmt.Errorf("%s: more than %d bytes: %w", path, o.MaxFileBytes, ErrTooLarge)
	}
	cfg, format, err := image.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s: not a PNG, JPEG or GIF image (%v): %w", path, err, ErrImage)
	}
	if cfg.Width < 1 || cfg.Height < 1 {
		return fmt.Errorf("%s: %s of %dx%d pixels, empty: %w", path, format, cfg.Width, cfg.Height, ErrImage)
	}
	if cfg.Width > o.MaxPixels/cfg.Height {
		return fmt.Errorf("%s: %s of %dx%d pixels, more than %s: %w",
			path, format, cfg.Width, cfg.Height, pixelCount(o.MaxPixels), ErrTooLarge)
	}
	img, _, err := image.Decode(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s: corrupt %s image (%v): %w", path, format, err, ErrImage)
	}
	if r := img.Bounds(); r.Dx() != cfg.Width || r.Dy() != cfg.Height {
		return fmt.Errorf("%s: %s decodes to %dx%d pixels, its header says %dx%d: %w",
			path, format, r.Dx(), r.Dy(), cfg.Width, cfg.Height, ErrImage)
	}
	resize(dst, img, o)
	return nil
}

func pixelCount(n int) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d megapixels", n>>20)
	}
	return fmt.Sprintf("%d pixels", n)
}

// resize samples img at o's size with bilinear interpolation, pixel centres
// aligned and edges clamped, and writes channel-major values in [0, 1]. It
// reads four source pixels per output pixel, so its cost is that of the
// output, whatever the source's size.
func resize(dst []float32, img image.Image, o ImageOptions) {
	r := img.Bounds()
	plane := o.Width * o.Height
	for y := range o.Height {
		y0, y1, fy := bilinearAxis(y, o.Height, r.Dy())
		for x := range o.Width {
			x0, x1, fx := bilinearAxis(x, o.Width, r.Dx())
			var rgb [3]float64
			for _, c := range [4]struct {
				x, y int
				w    float64
			}{{x0, y0, (1 - fx) * (1 - fy)}, {x1, y0, fx * (1 - fy)}, {x0, y1, (1 - fx) * fy}, {x1, y1, fx * fy}} {
				if c.w == 0 {
					continue
				}
				// RGBA is alpha-premultiplied: transparent pixels are black.
				pr, pg, pb, _ := img.At(r.Min.X+c.x, r.Min.Y+c.y).RGBA()
				rgb[0] += c.w * float64(pr) / 0xffff
				rgb[1] += c.w * float64(pg) / 0xffff
				rgb[2] += c.w * float64(pb) / 0xffff
			}
			i := y*o.Width + x
			if o.Gray {
				// ITU-R BT.601 luma, as image/color's GrayModel.
				dst[i] = unit(0.299*rgb[0] + 0.587*rgb[1] + 0.114*rgb[2])
				continue
			}
			for ch := range rgb {
				dst[ch*plane+i] = unit(rgb[ch])
			}
		}
	}
}

// bilinearAxis maps output index i of n onto a source axis of length src:
// the two neighbouring source indices and the weight of the second.
func bilinearAxis(i, n, src int) (i0, i1 int, f float64) {
	s := max((float64(i)+0.5)*float64(src)/float64(n)-0.5, 0)
	i0 = int(s)
	if i0 >= src-1 {
		return src - 1, src - 1, 0
	}
	return i0, i0 + 1, s - float64(i0)
}

// unit clamps rounding error so features stay within [0, 1].
func unit(v float64) float32 { return float32(min(max(v, 0), 1)) }
