// Package countio counts the bytes that pass through a reader or writer:
// the size of something streamed, learned without holding it.
package countio

import "io"

// Writer counts the bytes written through it to W.
type Writer struct {
	W io.Writer
	N int64
}

func (c *Writer) Write(p []byte) (int, error) {
	n, err := c.W.Write(p)
	c.N += int64(n)
	return n, err
}

// Reader counts the bytes read through it from R.
type Reader struct {
	R io.Reader
	N int64
}

func (c *Reader) Read(p []byte) (int, error) {
	n, err := c.R.Read(p)
	c.N += int64(n)
	return n, err
}
