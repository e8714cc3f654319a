package api

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"

	"github.com/fleetlearn/fleetlearn/internal/sandboxlimits"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

type taskServer struct {
	apiv1.UnimplementedTaskServiceServer
	*service
}

func (s *taskServer) CreateTask(ctx context.Context, req *pb.CreateTaskRequest) (*pb.CreateTaskResponse, error) {
	const op = "create task"
	t, err := taskForCreate(op, req.GetTask())
	if err != nil {
		return nil, err
	}
	created, warnings, err := s.b.CreateTask(ctx, t)
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.CreateTaskResponse{Task: created, Warnings: warnings}, nil
}

// taskForCreate checks the fields the API can judge alone and returns a copy
// with the output-only fields cleared; the backend validates the rest.
func taskForCreate(op string, in *pb.Task) (*pb.Task, error) {
	if in == nil {
		return nil, invalid(op, "task is required")
	}
	if err := checkID(op, "task.name", in.GetName()); err != nil {
		return nil, err
	}
	if err := checkID(op, "task.model.version", in.GetModel().GetVersion()); err != nil {
		return nil, err
	}
	if err := checkSHA256(op, "task.model.sha256", in.GetModel().GetSha256(), false); err != nil {
		return nil, err
	}
	if err := checkSHA256(op, "task.module.sha256", in.GetModule().GetSha256(), true); err != nil {
		return nil, err
	}
	if err := checkJSONObject(op, "task.hyperparameters", in.GetHyperparameters()); err != nil {
		return nil, err
	}
	if err := checkText(op, "task.server_eval_dataset", in.GetServerEvalDataset(), maxTextLen); err != nil {
		return nil, err
	}
	// Every device converts the limits the same way; refusing here beats a
	// task that fails on each device it reaches.
	if _, err := sandboxlimits.FromProto(in.GetLimits()); err != nil {
		return nil, invalid(op, "task."+err.Error())
	}
	for _, c := range in.GetEligibility().GetDeviceClasses() {
		if err := checkID(op, "task.eligibility.device_classes", c); err != nil {
			return nil, err
		}
	}
	t := proto.CloneOf(in)
	t.Id = ""
	t.State = pb.TaskState_TASK_STATE_UNSPECIFIED
	t.CurrentRound = 0
	t.CurrentModel = nil
	t.StateReason = ""
	t.CreateTime = nil
	t.UpdateTime = nil
	t.BaseMetrics = nil // output only: the server measures it
	return t, nil
}

func (s *taskServer) GetTask(ctx context.Context, req *pb.GetTaskRequest) (*pb.GetTaskResponse, error) {
	const op = "get task"
	if err := checkID(op, "task_id", req.GetTaskId()); err != nil {
		return nil, err
	}
	t, err := s.b.GetTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.GetTaskResponse{Task: t}, nil
}

func (s *taskServer) ListTasks(ctx context.Context, req *pb.ListTasksRequest) (*pb.ListTasksResponse, error) {
	const op = "list tasks"
	p, err := page(op, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	if _, ok := pb.TaskState_name[int32(req.GetState())]; !ok {
		return nil, invalid(op, fmt.Sprintf("unknown state %d", req.GetState()))
	}
	ts, next, err := s.b.ListTasks(ctx, req.GetState(), p)
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.ListTasksResponse{Tasks: ts, NextPageToken: next}, nil
}

func (s *taskServer) StopTask(ctx context.Context, req *pb.StopTaskRequest) (*pb.StopTaskResponse, error) {
	const op = "stop task"
	if err := checkID(op, "task_id", req.GetTaskId()); err != nil {
		return nil, err
	}
	if err := checkText(op, "reason", req.GetReason(), maxTextLen); err != nil {
		return nil, err
	}
	t, err := s.b.StopTask(ctx, req.GetTaskId(), req.GetReason())
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.StopTaskResponse{Task: t}, nil
}

func (s *taskServer) ResumeTask(ctx context.Context, req *pb.ResumeTaskRequest) (*pb.ResumeTaskResponse, error) {
	const op = "resume task"
	if err := checkID(op, "task_id", req.GetTaskId()); err != nil {
		return nil, err
	}
	t, err := s.b.ResumeTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.ResumeTaskResponse{Task: t}, nil
}

func (s *taskServer) WatchTask(req *pb.WatchTaskRequest, stream grpc.ServerStreamingServer[pb.WatchTaskResponse]) error {
	const op = "watch task"
	ctx := stream.Context()
	if err := checkID(op, "task_id", req.GetTaskId()); err != nil {
		return err
	}
	events, err := s.b.WatchTask(ctx, req.GetTaskId())
	if err != nil {
		return s.toStatus(ctx, op, err)
	}
	for {
		select {
		case <-ctx.Done():
			return s.toStatus(ctx, op, ctx.Err())
		case m, ok := <-events:
			if !ok {
				return nil // the task finished or paused
			}
			if m == nil {
				continue
			}
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

func (s *taskServer) ListRounds(ctx context.Context, req *pb.ListRoundsRequest) (*pb.ListRoundsResponse, error) {
	const op = "list rounds"
	if err := checkID(op, "task_id", req.GetTaskId()); err != nil {
		return nil, err
	}
	p, err := page(op, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	rs, next, err := s.b.ListRounds(ctx, req.GetTaskId(), p)
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.ListRoundsResponse{Rounds: rs, NextPageToken: next}, nil
}
