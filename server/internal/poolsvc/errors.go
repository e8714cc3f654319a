package poolsvc

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrClosed reports a call after Shutdown.
var ErrClosed = errors.New("poolsvc: service shut down")

// ErrConfig reports Deps out of range.
var ErrConfig = errors.New("poolsvc: invalid configuration")

func errorf(c codes.Code, format string, a ...any) error {
	return status.Error(c, fmt.Sprintf(format, a...))
}

func invalidf(format string, a ...any) error { return errorf(codes.InvalidArgument, format, a...) }
