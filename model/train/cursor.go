package train

import (
	"fmt"
	"math"

	"github.com/fleetlearn/fleetlearn/model/sgd"
)

// cursor is where a stepper is in its data, (epoch, batch): the next step
// runs batch number batch of sgd.Batches(sgd.Order(n, seed, epoch), size).
// Stepper and LMStepper share it, so both walk the batches their Train
// functions walk.
type cursor struct {
	n, size      int
	seed         uint64
	epoch, batch int
	batches      [][]int32 // the batches of epoch, computed once per epoch
	perEpoch     int
}

func newCursor(n, size int, seed uint64) cursor {
	return cursor{n: n, size: size, seed: seed, perEpoch: (n + size - 1) / size}
}

// peek returns the batch at the cursor.
func (c *cursor) peek() []int32 {
	if c.batches == nil {
		c.batches = sgd.Batches(sgd.Order(c.n, c.seed, c.epoch), c.size)
	}
	return c.batches[c.batch]
}

// advance moves past the batch at the cursor, to the next epoch after its
// last batch. A step that failed does not advance, so the cursor still
// names the batch it could not run.
func (c *cursor) advance() {
	c.peek()
	if c.batch++; c.batch == len(c.batches) {
		c.epoch, c.batch, c.batches = c.epoch+1, 0, nil
	}
}

// Cursor returns the epoch and batch the next Step runs.
func (c *cursor) Cursor() (epoch, batch int) { return c.epoch, c.batch }

// BatchesPerEpoch returns the number of Steps in one epoch.
func (c *cursor) BatchesPerEpoch() int { return c.perEpoch }

// Seek moves the cursor so that the next Step runs the given batch of the
// given epoch. It refuses, with ErrCursor, a negative epoch or a batch
// outside [0, BatchesPerEpoch).
func (c *cursor) Seek(epoch, batch int) error {
	if epoch < 0 || epoch > math.MaxInt32 || batch < 0 || batch >= c.perEpoch {
		return fmt.Errorf("train: seek (%d, %d) with %d batches per epoch: %w", epoch, batch, c.perEpoch, ErrCursor)
	}
	if epoch != c.epoch {
		c.batches = nil
	}
	c.epoch, c.batch = epoch, batch
	return nil
}
