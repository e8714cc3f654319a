package cli

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors for failures the CLI detects itself.
var (
	// ErrUsage reports flags or arguments that cannot be used together or
	// are out of range.
	ErrUsage = errors.New("invalid usage")
	// ErrInput reports a local file that is not what the command needs.
	ErrInput = errors.New("invalid input file")
	// ErrProtocol reports a server response that breaks the API contract.
	ErrProtocol = errors.New("protocol error")
	// ErrTaskFailed reports that a watched task ended in the FAILED state.
	ErrTaskFailed = errors.New("task failed")
	// ErrTaskPaused reports that a watched task was paused by the server:
	// it waits for an operator to resume it.
	ErrTaskPaused = errors.New("task paused")
	// ErrWatchEnded reports a watch the server ended before the task did.
	ErrWatchEnded = errors.New("watch ended before the task")
	// ErrUnknownModel reports a model reference (NAME, NAME@N or a sha256
	// prefix) that names no model version, or more than one.
	ErrUnknownModel = errors.New("unknown model")
)

// rpcError rewrites a gRPC status error into a message for an operator,
// keeping the status reachable with errors.As and status.Code. The server's
// messages already name the operation and the object.
func (a *app) rpcError(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	var msg string
	switch st.Code() {
	case codes.Unavailable:
		msg = fmt.Sprintf("server %s unavailable: %s", a.server, st.Message())
		if !a.insecure && a.caFile == "" && strings.Contains(st.Message(), "certificate") {
			msg += " (is --ca set to the server's CA certificate?)"
		}
	case codes.Unauthenticated:
		msg = st.Message()
		if a.token == "" && a.tokenFile == "" {
			msg += " (pass --token-file or --token, or set $" + TokenFileEnv + " or $" + TokenEnv + ")"
		} else {
			msg += " (the server refused the token: check that it is this server's and whole, or mint a new one on the server's host" +
				" with fleetlearn token mint --data-dir DIR --subject NAME --role ROLE; the server writes an admin token to DIR/admin.token)"
		}
	case codes.DeadlineExceeded:
		msg = fmt.Sprintf("%s (deadline exceeded; see --timeout)", st.Message())
	case codes.Canceled:
		msg = "canceled"
	case codes.Unimplemented:
		msg = fmt.Sprintf("server %s does not support this command: %s", a.server, st.Message())
	case codes.Internal:
		msg = st.Message() + " (details are in the server log)"
	default:
		msg = st.Message()
	}
	return &rpcErr{msg: msg, err: err}
}

type rpcErr struct {
	msg string
	err error
}

func (e *rpcErr) Error() string { return e.msg }
func (e *rpcErr) Unwrap() error { return e.err }

// sentence is an error whose message is a whole sentence for an operator,
// naming each thing once, while errors.Is still finds the sentinel.
type sentence struct {
	msg string
	is  error
}

func (e *sentence) Error() string { return e.msg }
func (e *sentence) Unwrap() error { return e.is }
