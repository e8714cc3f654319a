package api_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

func TestErrorMapping(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{fmt.Errorf("task %q: %w", "t1", backend.ErrNotFound), codes.NotFound, `get task: task "t1": not found`},
		{fmt.Errorf("cohort: %w", backend.ErrInvalid), codes.InvalidArgument, "get task: cohort: invalid argument"},
		{fmt.Errorf("t1: %w", backend.ErrExists), codes.AlreadyExists, "get task: t1: already exists"},
		{fmt.Errorf("t1: %w", backend.ErrPrecondition), codes.FailedPrecondition, "get task: t1: failed precondition"},
		{fmt.Errorf("t1: %w", backend.ErrTooLarge), codes.ResourceExhausted, "get task: t1: too large"},
		{fmt.Errorf("store: %w", backend.ErrUnavailable), codes.Unavailable, "get task: store: unavailable"},
		{fmt.Errorf("store: %w", context.Canceled), codes.Canceled, "get task: store: context canceled"},
		{fmt.Errorf("store: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "get task: store: context deadline exceeded"},
		{errors.New("sqlite: disk I/O error at /var/lib/fleetlearn/db"), codes.Internal, "get task: internal error"},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			e := newEnv(t)
			e.b.FailWith(tc.err)
			_, err := e.tasks.GetTask(testContext(t), &pb.GetTaskRequest{TaskId: "t1"})
			wantCode(t, err, tc.code)
			if got := status.Convert(err).Message(); got != tc.msg {
				t.Errorf("message = %q, want %q", got, tc.msg)
			}
			logged := strings.Contains(e.logs.String(), "disk I/O error")
			if logged != (tc.code == codes.Internal) {
				t.Errorf("detail logged = %v; logs:\n%s", logged, e.logs.String())
			}
		})
	}
}

// TestErrorMappingEveryRPC checks that each RPC passes backend errors
// through the mapping, with its own operation prefix.
func TestErrorMappingEveryRPC(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	calls := map[string]func(context.Context, *env) error{
		"create task": func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: &pb.Task{Name: "n",
				Model: &pb.ModelRef{Version: "m@1"}, Module: &pb.ModuleRef{Sha256: sha}}})
			return err
		},
		"get task": func(ctx context.Context, e *env) error {
			_, err := e.tasks.GetTask(ctx, &pb.GetTaskRequest{TaskId: "t"})
			return err
		},
		"list tasks": func(ctx context.Context, e *env) error {
			_, err := e.tasks.ListTasks(ctx, &pb.ListTasksRequest{})
			return err
		},
		"stop task": func(ctx context.Context, e *env) error {
			_, err := e.tasks.StopTask(ctx, &pb.StopTaskRequest{TaskId: "t"})
			return err
		},
		"resume task": func(ctx context.Context, e *env) error {
			_, err := e.tasks.ResumeTask(ctx, &pb.ResumeTaskRequest{TaskId: "t"})
			return err
		},
		"watch task": func(ctx context.Context, e *env) error {
			s, err := e.tasks.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: "t"})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		},
		"list rounds": func(ctx context.Context, e *env) error {
			_, err := e.tasks.ListRounds(ctx, &pb.ListRoundsRequest{TaskId: "t"})
			return err
		},
		"import model": func(ctx context.Context, e *env) error {
			st, err := e.models.ImportModel(ctx)
			_, err = upload(t, st, err, []*pb.ImportModelRequest{modelHeader("m", 0, ""), modelChunk([]byte("x"))})
			return err
		},
		"export model": func(ctx context.Context, e *env) error {
			s, err := e.models.ExportModel(ctx, &pb.ExportModelRequest{Version: "m@1"})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		},
		"get model": func(ctx context.Context, e *env) error {
			_, err := e.models.GetModel(ctx, &pb.GetModelRequest{Version: "m@1"})
			return err
		},
		"list models": func(ctx context.Context, e *env) error {
			_, err := e.models.ListModels(ctx, &pb.ListModelsRequest{})
			return err
		},
		"register module": func(ctx context.Context, e *env) error {
			st, err := e.modules.RegisterModule(ctx)
			_, err = upload(t, st, err, []*pb.RegisterModuleRequest{moduleHeader("m", 0, ""), moduleChunk([]byte("x"))})
			return err
		},
		"get module": func(ctx context.Context, e *env) error {
			_, err := e.modules.GetModule(ctx, &pb.GetModuleRequest{Sha256: sha})
			return err
		},
		"list modules": func(ctx context.Context, e *env) error {
			_, err := e.modules.ListModules(ctx, &pb.ListModulesRequest{})
			return err
		},
	}
	e := newEnv(t)
	e.b.FailWith(fmt.Errorf("nats: %w", backend.ErrUnavailable))
	for op, call := range calls {
		err := call(testContext(t), e)
		wantCode(t, err, codes.Unavailable)
		if got, want := status.Convert(err).Message(), op+": nats: unavailable"; got != want {
			t.Errorf("%s: message = %q, want %q", op, got, want)
		}
	}
}

// TestValidation checks requests that must be refused at the boundary,
// before the backend sees them.
func TestValidation(t *testing.T) {
	sha := strings.Repeat("0", 64)
	okTask := func() *pb.Task {
		return &pb.Task{Name: "n", Model: &pb.ModelRef{Version: "m@1"}, Module: &pb.ModuleRef{Sha256: sha}}
	}
	withTask := func(f func(*pb.Task)) *pb.CreateTaskRequest {
		t := okTask()
		f(t)
		return &pb.CreateTaskRequest{Task: t}
	}
	long := strings.Repeat("x", 300)
	for _, tc := range []struct {
		name string
		call func(context.Context, *env) error
	}{
		{"create nil task", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{})
			return err
		}},
		{"create without name", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) { t.Name = "" }))
			return err
		}},
		{"create with control characters in name", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) { t.Name = "a\nb" }))
			return err
		}},
		{"create without model", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) { t.Model = nil }))
			return err
		}},
		{"create with bad model digest", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) { t.Model.Sha256 = "abc" }))
			return err
		}},
		{"create without module", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) { t.Module = nil }))
			return err
		}},
		{"create with uppercase module digest", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) { t.Module.Sha256 = strings.Repeat("A", 64) }))
			return err
		}},
		{"create with non-JSON hyperparameters", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) { t.Hyperparameters = []byte("lr=1") }))
			return err
		}},
		{"create with JSON array hyperparameters", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) { t.Hyperparameters = []byte("[1]") }))
			return err
		}},
		{"create with null hyperparameters", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) { t.Hyperparameters = []byte("null") }))
			return err
		}},
		{"create with huge hyperparameters", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) {
				t.Hyperparameters = []byte(`{"x":"` + strings.Repeat("y", 1<<20) + `"}`)
			}))
			return err
		}},
		{"create with empty device class", func(ctx context.Context, e *env) error {
			_, err := e.tasks.CreateTask(ctx, withTask(func(t *pb.Task) {
				t.Eligibility = &pb.Eligibility{DeviceClasses: []string{""}}
			}))
			return err
		}},
		{"get without id", func(ctx context.Context, e *env) error {
			_, err := e.tasks.GetTask(ctx, &pb.GetTaskRequest{})
			return err
		}},
		{"get with long id", func(ctx context.Context, e *env) error {
			_, err := e.tasks.GetTask(ctx, &pb.GetTaskRequest{TaskId: long})
			return err
		}},
		{"list tasks with negative page size", func(ctx context.Context, e *env) error {
			_, err := e.tasks.ListTasks(ctx, &pb.ListTasksRequest{PageSize: -1})
			return err
		}},
		{"list tasks with unknown state", func(ctx context.Context, e *env) error {
			_, err := e.tasks.ListTasks(ctx, &pb.ListTasksRequest{State: 99})
			return err
		}},
		{"list tasks with huge page token", func(ctx context.Context, e *env) error {
			_, err := e.tasks.ListTasks(ctx, &pb.ListTasksRequest{PageToken: strings.Repeat("x", 2000)})
			return err
		}},
		{"stop without id", func(ctx context.Context, e *env) error {
			_, err := e.tasks.StopTask(ctx, &pb.StopTaskRequest{Reason: "r"})
			return err
		}},
		{"stop with huge reason", func(ctx context.Context, e *env) error {
			_, err := e.tasks.StopTask(ctx, &pb.StopTaskRequest{TaskId: "t", Reason: strings.Repeat("r", 5000)})
			return err
		}},
		{"watch without id", func(ctx context.Context, e *env) error {
			s, err := e.tasks.WatchTask(ctx, &pb.WatchTaskRequest{})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}},
		{"list rounds without id", func(ctx context.Context, e *env) error {
			_, err := e.tasks.ListRounds(ctx, &pb.ListRoundsRequest{})
			return err
		}},
		{"list rounds with negative page size", func(ctx context.Context, e *env) error {
			_, err := e.tasks.ListRounds(ctx, &pb.ListRoundsRequest{TaskId: "t", PageSize: -5})
			return err
		}},
		{"export without version", func(ctx context.Context, e *env) error {
			s, err := e.models.ExportModel(ctx, &pb.ExportModelRequest{})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}},
		{"get model without version", func(ctx context.Context, e *env) error {
			_, err := e.models.GetModel(ctx, &pb.GetModelRequest{})
			return err
		}},
		{"list models with negative page size", func(ctx context.Context, e *env) error {
			_, err := e.models.ListModels(ctx, &pb.ListModelsRequest{PageSize: -1})
			return err
		}},
		{"list models with long name", func(ctx context.Context, e *env) error {
			_, err := e.models.ListModels(ctx, &pb.ListModelsRequest{Name: long})
			return err
		}},
		{"get module without digest", func(ctx context.Context, e *env) error {
			_, err := e.modules.GetModule(ctx, &pb.GetModuleRequest{})
			return err
		}},
		{"get module with short digest", func(ctx context.Context, e *env) error {
			_, err := e.modules.GetModule(ctx, &pb.GetModuleRequest{Sha256: "abcd"})
			return err
		}},
		{"list modules with negative page size", func(ctx context.Context, e *env) error {
			_, err := e.modules.ListModules(ctx, &pb.ListModulesRequest{PageSize: -1})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.b.FailWith(errBackendReached)
			err := tc.call(testContext(t), e)
			wantCode(t, err, codes.InvalidArgument)
		})
	}
}
