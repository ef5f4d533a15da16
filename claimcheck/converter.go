package claimcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/resultstore"
)

// DataConverter returns the SDK's default data converter with payloads
// over the threshold stored in s (and, with o.Keys, every payload
// encrypted), for client.Options.DataConverter of every worker and client
// of the workflows. It is safe for concurrent use. Store calls inside
// workflow code do not trip the SDK's deadlock detector.
func DataConverter(s resultstore.Store, o Options) converter.DataConverter {
	dc := &dataConverter{parent: converter.GetDefaultDataConverter(), store: newStore(s, o)}
	if o.Keys != nil {
		dc.enc = codec.NewCodec(o.Keys)
	}
	return workflow.DataConverterWithoutDeadlockDetection(dc)
}

// dataConverter is one converter bound, by the SDK, to where it converts:
// a workflow (WithWorkflowContext), an activity or a client call
// (WithContext), and the workflow or activity a payload is for
// (WithSerializationContext). What it stores is claimed for the workflows
// that binding names (claims).
type dataConverter struct {
	parent converter.DataConverter
	store  *store
	enc    converter.PayloadCodec // nil: no encryption

	ctx context.Context // a client's or an activity's; nil in workflow code
	// inWorkflow: bound to workflow code, where a store failure fails the
	// workflow task.
	inWorkflow bool
	// writer is the workflow whose code, or whose activity, converts;
	// writerParent its parent.
	writer, writerParent string
	// target is the workflow the payload is for (a child, a signaled
	// workflow, the workflow a client starts); forActivity says the
	// payload is an activity's.
	target      string
	forActivity bool
}

var (
	_ converter.ContextAware                          = (*dataConverter)(nil)
	_ converter.DataConverterWithSerializationContext = (*dataConverter)(nil)
)

// claims are the workflows a payload written here is stored for.
func (d *dataConverter) claims() []string {
	var ids []string
	add := func(id string) {
		if id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	add(d.writer)
	switch {
	case d.forActivity:
		add(d.target)
	case d.target != "" && d.target != d.writer:
		// A child's input, a signal to another workflow, a client's start.
		add(d.target)
	default:
		// The workflow's own input, result, Continue-As-New arguments:
		// its parent reads its result.
		add(d.writerParent)
	}
	return ids
}

func (d *dataConverter) base() context.Context {
	if d.ctx != nil {
		return d.ctx
	}
	return context.Background()
}

// fail returns err, or in workflow code panics with a store failure so
// that the workflow task fails and is retried.
func (d *dataConverter) fail(err error) error {
	var se *storeError
	if d.inWorkflow && errors.As(err, &se) {
		panic(err)
	}
	return err
}

func (d *dataConverter) encode(ps []*commonpb.Payload, values []any) ([]*commonpb.Payload, error) {
	out, err := d.store.encode(d.base(), d.claims(), ps, d.store.thresholds(values))
	if err != nil {
		return nil, d.fail(err)
	}
	if d.enc != nil {
		return d.enc.Encode(out)
	}
	return out, nil
}

func (d *dataConverter) decode(ps []*commonpb.Payload) ([]*commonpb.Payload, error) {
	if d.enc != nil {
		var err error
		if ps, err = d.enc.Decode(ps); err != nil {
			return nil, err
		}
	}
	out, err := d.store.decode(d.base(), ps)
	if err != nil {
		return nil, d.fail(err)
	}
	return out, nil
}

// SelfEncoding is a value that writes its own JSON payload: JSON that
// json.Unmarshal decodes as it decodes json.Marshal's output for the
// value, and an error where json.Marshal has one. The converter takes it
// instead of json.Marshal's, which compacts every verbatim member
// (json.RawMessage) with a pass of its scanner, so a large request is
// not scanned on its way into a payload. workflows.ActionInput and
// attempt.Input are.
type SelfEncoding interface {
	JSONPayload() ([]byte, error)
}

// toPayload is the parent's ToPayload, or a SelfEncoding value's own JSON.
func (d *dataConverter) toPayload(value any) (*commonpb.Payload, error) {
	v, ok := value.(SelfEncoding)
	if !ok {
		return d.parent.ToPayload(value)
	}
	data, err := v.JSONPayload()
	if err != nil {
		// As the SDK's JSON payload converter reports it.
		return nil, fmt.Errorf("%w: %v", converter.ErrUnableToEncode, err)
	}
	return &commonpb.Payload{Metadata: map[string][]byte{converter.MetadataEncoding: []byte(converter.MetadataEncodingJSON)}, Data: data}, nil
}

// ToPayload implements converter.DataConverter.
func (d *dataConverter) ToPayload(value any) (*commonpb.Payload, error) {
	p, err := d.toPayload(value)
	if p == nil || err != nil {
		return p, err
	}
	out, err := d.encode([]*commonpb.Payload{p}, []any{value})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// toPayloads is the parent's ToPayloads, with SelfEncoding values' own
// JSON.
func (d *dataConverter) toPayloads(values []any) (*commonpb.Payloads, error) {
	if !slices.ContainsFunc(values, func(v any) bool { _, ok := v.(SelfEncoding); return ok }) {
		return d.parent.ToPayloads(values...)
	}
	// The parent's loop (converter.CompositeDataConverter.ToPayloads).
	ps := &commonpb.Payloads{}
	for i, v := range values {
		p, err := d.toPayload(v)
		if err != nil {
			return nil, fmt.Errorf("values[%d]: %w", i, err)
		}
		ps.Payloads = append(ps.Payloads, p)
	}
	return ps, nil
}

// ToPayloads implements converter.DataConverter.
func (d *dataConverter) ToPayloads(values ...any) (*commonpb.Payloads, error) {
	ps, err := d.toPayloads(values)
	if ps == nil || err != nil {
		return ps, err
	}
	out, err := d.encode(ps.GetPayloads(), values)
	if err != nil {
		return nil, err
	}
	return &commonpb.Payloads{Payloads: out}, nil
}

// SelfChecking is a value whose UnmarshalJSON checks the whole of what it
// is given, as json.Unmarshal does (it decodes it with json.Unmarshal):
// the converter hands it a JSON payload's data directly, without the
// check of the whole input json.Unmarshal makes before it calls
// UnmarshalJSON, so a large payload is scanned once, not twice.
// workflows.ActionInput is one.
type SelfChecking interface {
	json.Unmarshaler
	ChecksItsJSON()
}

// fromPayload is the parent's FromPayload, or a SelfChecking value's own
// decoding of a JSON payload.
func (d *dataConverter) fromPayload(p *commonpb.Payload, valuePtr any) error {
	v, ok := valuePtr.(SelfChecking)
	if !ok || string(p.GetMetadata()[converter.MetadataEncoding]) != converter.MetadataEncodingJSON {
		return d.parent.FromPayload(p, valuePtr)
	}
	if err := v.UnmarshalJSON(p.GetData()); err != nil {
		// As the SDK's JSON payload converter reports it.
		return fmt.Errorf("%w: %v", converter.ErrUnableToDecode, err)
	}
	return nil
}

// FromPayload implements converter.DataConverter.
func (d *dataConverter) FromPayload(p *commonpb.Payload, valuePtr any) error {
	if p == nil {
		return nil
	}
	out, err := d.decode([]*commonpb.Payload{p})
	if err != nil {
		return err
	}
	return d.fromPayload(out[0], valuePtr)
}

// FromPayloads implements converter.DataConverter.
func (d *dataConverter) FromPayloads(ps *commonpb.Payloads, valuePtrs ...any) error {
	if ps == nil {
		return d.parent.FromPayloads(ps, valuePtrs...)
	}
	out, err := d.decode(ps.GetPayloads())
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(valuePtrs, func(v any) bool { _, ok := v.(SelfChecking); return ok }) {
		return d.parent.FromPayloads(&commonpb.Payloads{Payloads: out}, valuePtrs...)
	}
	// The parent's loop (converter.CompositeDataConverter.FromPayloads).
	for i, p := range out {
		if i >= len(valuePtrs) {
			break
		}
		if err := d.fromPayload(p, valuePtrs[i]); err != nil {
			return fmt.Errorf("payload item %d: %w", i, err)
		}
	}
	return nil
}

// ToString implements converter.DataConverter.
func (d *dataConverter) ToString(p *commonpb.Payload) string {
	out, err := d.withoutPanic().decode([]*commonpb.Payload{p})
	if err != nil {
		return err.Error()
	}
	return d.parent.ToString(out[0])
}

// ToStrings implements converter.DataConverter.
func (d *dataConverter) ToStrings(ps *commonpb.Payloads) []string {
	if ps == nil {
		return nil
	}
	strs := make([]string, len(ps.GetPayloads()))
	for i, p := range ps.GetPayloads() {
		strs[i] = d.ToString(p)
	}
	return strs
}

// withoutPanic is d returning store failures (ToString is for logs).
func (d *dataConverter) withoutPanic() *dataConverter {
	c := *d
	c.inWorkflow = false
	return &c
}

// probeKey marks a workflow context Active asks about.
type probeKey struct{}

// WithWorkflowContext implements converter.ContextAware: payloads
// converted in workflow code are claimed for the workflow (and its
// parent, for its own payloads).
func (d *dataConverter) WithWorkflowContext(ctx workflow.Context) converter.DataConverter {
	if seen, ok := ctx.Value(probeKey{}).(*bool); ok && seen != nil {
		*seen = true
	}
	c := *d
	info := workflow.GetInfo(ctx)
	c.ctx, c.inWorkflow = nil, true
	c.writer, c.writerParent = info.WorkflowExecution.ID, ""
	if p := info.ParentWorkflowExecution; p != nil {
		c.writerParent = p.ID
	}
	return &c
}

// WithContext implements converter.ContextAware: store calls follow ctx,
// and an activity's payloads are claimed for its workflow.
func (d *dataConverter) WithContext(ctx context.Context) converter.DataConverter {
	c := *d
	c.ctx, c.inWorkflow, c.writerParent = ctx, false, ""
	c.writer = ""
	if activity.IsActivity(ctx) {
		c.writer = activity.GetInfo(ctx).WorkflowExecution.ID
	}
	return &c
}

// WithSerializationContext implements
// converter.DataConverterWithSerializationContext: the workflow or
// activity a payload is for.
func (d *dataConverter) WithSerializationContext(sc converter.SerializationContext) converter.DataConverter {
	c := *d
	switch s := sc.(type) {
	case converter.WorkflowSerializationContext:
		c.target, c.forActivity = s.WorkflowID, false
	case converter.ActivitySerializationContext:
		c.target, c.forActivity = s.WorkflowID, true
	default:
		return d
	}
	return &c
}

// Active reports whether the data converter of the calling workflow's
// worker stores large payloads by reference (DataConverter). Without it,
// a payload over InlineLimit fails the workflow task for ever with
// Temporal's PayloadsTooLarge; package step refuses such a call instead.
// It asks the converter itself, through the SDK's ContextAware binding,
// so a converter that wraps this one without passing the workflow
// context on (converter.NewCodecDataConverter does not) reads as absent.
// It records nothing in history.
func Active(ctx workflow.Context) bool {
	var seen bool
	// A channel takes the workflow's data converter bound to the context
	// it is made on, and does nothing else.
	workflow.NewBufferedChannel(workflow.WithValue(ctx, probeKey{}, &seen), 0)
	return seen
}
