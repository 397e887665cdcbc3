// Two cameras sending raw frames to a pipeline in C++17 (cppzmq, nlohmann/json), written from
// docs/protocol.md ("Streams", "Pipelines on the wire"): each camera is a stream (its own "key"),
// keeps at most one frame in flight, and a frame captured while one is in flight waits; a newer one
// replaces it. The newest frame wins, here as in a daemon whose pipeline has
// queue_policy = "newest_per_key".
//
//   g++ -std=c++17 -O2 frames.cpp -o infermux-frames $(pkg-config --cflags --libs libzmq)
//   ./infermux-frames [ENDPOINT] [PIPELINE]
//
// ENDPOINT defaults to ipc:///run/infermux/infer.sock, PIPELINE to "camera" (a classifier pipeline:
// its reply's "classes" holds the best class of the frame).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

static const char* kCameras[] = {"cam-1", "cam-2"};
static const int kFrames = 8;  // captured per camera, one every kTickMs
static const int kTickMs = 10;
static const int kTimeoutMs = 10000;
static const int kWidth = 64, kHeight = 48;  // raw BGR, rows packed: stride = 3 * width

struct Camera {
    int in_flight = -1, waiting = -1, sent = 0, replaced = 0, served = 0, last = -1;
};

// Frame n of camera cam: byte i is (7 i + 13 n + 101 cam) mod 256, the same in every example client.
static std::string capture(int cam, int n) {
    std::string bytes(kWidth * kHeight * 3, '\0');
    for (size_t i = 0; i < bytes.size(); i++) bytes[i] = static_cast<char>((7 * i + 13 * n + 101 * cam) % 256);
    return bytes;
}

static void send_waiting(zmq::socket_t& sock, const std::string& pipeline, std::vector<Camera>& cams, int c) {
    Camera& cam = cams[c];
    if (cam.in_flight >= 0 || cam.waiting < 0) return;
    cam.in_flight = cam.waiting;
    cam.waiting = -1;
    cam.sent++;
    json header = {{"model", pipeline},
                   {"id", 1000 * c + cam.in_flight},  // echoed in the reply: which camera, which frame
                   {"key", kCameras[c]},  // the stream: a camera's frames are served in turn with the others'
                   {"inputs", {{{"name", "image"}, {"dtype", "uint8"}, {"shape", {kWidth * kHeight * 3}},
                                {"format", "bgr"}, {"width", kWidth}, {"height", kHeight}, {"stride", kWidth * 3}}}}};
    std::vector<zmq::message_t> request;
    request.emplace_back();  // the empty delimiter a REQ socket would add itself
    request.emplace_back(header.dump());
    request.emplace_back(capture(c, cam.in_flight));
    zmq::send_multipart(sock, request);
}

// One reply, if one came within timeout_ms; false when none did.
static bool receive(zmq::socket_t& sock, const std::string& pipeline, std::vector<Camera>& cams, int timeout_ms,
                    bool& failed) {
    zmq::pollitem_t items[] = {{sock.handle(), 0, ZMQ_POLLIN, 0}};
    if (zmq::poll(items, 1, std::chrono::milliseconds(timeout_ms)) == 0) return false;
    std::vector<zmq::message_t> reply;
    (void)zmq::recv_multipart(sock, std::back_inserter(reply));
    if (reply.size() < 2) return true;
    json head = json::parse(reply[1].to_string());  // reply[0]: the delimiter
    if (!head["id"].is_number_integer()) return true;  // not ours: its header could not be read
    int c = head["id"].get<int>() / 1000, n = head["id"].get<int>() % 1000;
    if (c < 0 || c >= static_cast<int>(cams.size()) || cams[c].in_flight != n) return true;
    cams[c].in_flight = -1;
    if (head["status"] == 200) {
        const json& best = head["classes"][0][0];
        cams[c].served++;
        cams[c].last = n;
        std::printf("%s frame %d: status 200, class %d (%.6g)\n", kCameras[c], n, best["index"].get<int>(),
                    best["score"].get<double>());
    } else {
        std::printf("%s frame %d: status %d: %s\n", kCameras[c], n, head["status"].get<int>(),
                    head["error"].get<std::string>().c_str());
        failed = true;
    }
    send_waiting(sock, pipeline, cams, c);
    return true;
}

int main(int argc, char** argv) {
    const std::string endpoint = argc > 1 ? argv[1] : "ipc:///run/infermux/infer.sock";
    const std::string pipeline = argc > 2 ? argv[2] : "camera";
    zmq::context_t ctx;
    zmq::socket_t sock(ctx, zmq::socket_type::dealer);
    sock.set(zmq::sockopt::linger, 0);
    bool failed = false;
    std::vector<Camera> cams(2);
    try {
        sock.connect(endpoint);
        auto busy = [&] {
            for (const Camera& cam : cams) if (cam.in_flight >= 0 || cam.waiting >= 0) return true;
            return false;
        };
        for (int n = 0; n < kFrames; n++) {
            for (int c = 0; c < static_cast<int>(cams.size()); c++) {
                if (cams[c].waiting >= 0) cams[c].replaced++;  // the newer frame takes its place
                cams[c].waiting = n;
                send_waiting(sock, pipeline, cams, c);
            }
            auto tick_end = Clock::now() + std::chrono::milliseconds(kTickMs);
            for (auto now = Clock::now(); now < tick_end; now = Clock::now()) {  // replies until the next frame
                int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(tick_end - now).count());
                receive(sock, pipeline, cams, left, failed);
            }
        }
        while (busy()) {  // while anything is in flight, a reply is on its way
            if (!receive(sock, pipeline, cams, kTimeoutMs, failed)) {
                std::fprintf(stderr, "no reply from %s within %d ms: is infermux running there?\n", endpoint.c_str(),
                             kTimeoutMs);
                return 1;
            }
        }
    } catch (const std::exception& e) {  // zmq::error_t, json::exception
        std::fprintf(stderr, "infermux frames: %s\n", e.what());
        return 1;
    }
    for (size_t c = 0; c < cams.size(); c++) {
        std::printf("%s: %d frames, %d sent, %d replaced, %d served\n", kCameras[c], kFrames, cams[c].sent,
                    cams[c].replaced, cams[c].served);
        if (cams[c].last != kFrames - 1) failed = true;  // the newest frame is always answered
    }
    return failed ? 1 : 0;
}
