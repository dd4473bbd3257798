"""Audio files of every container LLaMA-Factory reads (WAV, MP3, FLAC, OGG, M4A; mono and stereo; 8 to 48 kHz),
made here with PyAV's encoders, read by lathe as LLaMA-Factory 0.9.5 reads them: the regularized waveform (decoded,
averaged to mono, resampled with torchaudio's resampler), the expanded `<audio>` and Qwen2-Audio's input_features
equal to LLaMA-Factory's (tests/llm/golden/llamafactory_audio.safetensors, made by make_llamafactory_audio.py)."""

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("av")
pytest.importorskip("safetensors")

HERE = Path(__file__).parent
GOLDEN = HERE / "golden" / "llamafactory_audio.safetensors"


def _module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILES = _module("media_files", HERE / "media_files.py")
FAMILIES = _module("make_families", HERE / "golden" / "make_llamafactory_families.py")


@pytest.fixture(scope="module")
def audio_files(tmp_path_factory):
    return FILES.write_audio_files(tmp_path_factory.mktemp("audio"))


@pytest.fixture(scope="module")
def golden():
    from safetensors import safe_open

    with safe_open(str(GOLDEN), "pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}, handle.metadata()


@pytest.fixture(scope="module")
def plugin():
    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.qwen2_audio import Qwen2AudioPlugin

    tokenizer = FAMILIES.make_tokenizer("qwen2_audio")
    processor = FAMILIES.make_processor("qwen2_audio", tokenizer)
    return Qwen2AudioPlugin(processor, tokenizer, MediaSettings(audio_sampling_rate=FAMILIES.SAMPLING_RATE))


def test_pcm_wav_decodes_to_its_samples(audio_files):
    from lathe.llm.multimodal.audio import decode_audio

    for name in ("tone.wav", "stereo.wav"):
        _, channels, rate, samples = FILES.AUDIO_FILES[name]
        decoded, decoded_rate = decode_audio(str(audio_files[name]))
        source = FILES.make_signal(name, channels, rate, samples)
        assert decoded_rate == rate and decoded.dtype == torch.float32 and tuple(decoded.shape) == source.shape
        # 16-bit PCM: each sample within one quantization step of the signal
        assert float((decoded - torch.from_numpy(source)).abs().max()) <= 1 / 32768


def test_compressed_files_decode_to_the_signal(audio_files):
    from lathe.llm.multimodal.audio import decode_audio

    for name in ("song.mp3", "voice.flac", "talk.ogg", "clip.m4a"):
        _, channels, rate, samples = FILES.AUDIO_FILES[name]
        decoded, decoded_rate = decode_audio(str(audio_files[name]))
        assert decoded_rate == rate and decoded.shape[0] == channels and decoded.shape[1] >= samples - 1200
        source = torch.from_numpy(FILES.make_signal(name, channels, rate, samples))
        if name == "voice.flac":  # lossless: 16-bit quantization only
            assert float((decoded - source).abs().max()) <= 1 / 32768
        else:  # lossy (and Opus shifts by its pre-skip): the same tone, loud and correlated
            length = min(decoded.shape[1], samples)
            a, b = decoded[0, :length] - decoded[0, :length].mean(), source[0, :length] - source[0, :length].mean()
            assert float((a * b).sum() / (a.norm() * b.norm())) > 0.9, name


def test_audio_reads_as_llamafactory(audio_files, golden, plugin):
    """Each file: LLaMA-Factory's regularized waveform, `<audio>` expansion and Qwen2-Audio features."""
    tensors, metadata = golden
    assert json.loads(metadata["versions"])["llamafactory"] == "0.9.5"
    for name, path in audio_files.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == metadata[f"sha256.{name}"], (
            f"PyAV's {name} differs from the golden's: rerun tests/llm/golden/make_llamafactory_audio.py"
        )
        wave = plugin.regularize("audio", [str(path)], "row 1")
        assert wave[0].dtype == np.float32
        torch.testing.assert_close(torch.from_numpy(wave[0]), tensors[f"wave.{name}"], rtol=1e-5, atol=1e-6)
        inputs = plugin.batch_inputs([{"audio": wave}], {"input_ids": torch.zeros(1, 4, dtype=torch.long)}, None, [[]])
        torch.testing.assert_close(inputs["input_features"], tensors[f"features.{name}"], rtol=1e-5, atol=1e-5)
        assert torch.equal(inputs["feature_attention_mask"], tensors[f"mask.{name}"])
        messages = plugin.process_messages([{"role": "user", "content": "<audio>What is this?"}], {"audio": wave})
        assert messages[0]["content"] == metadata[f"messages.{name}"]


def test_resampling_keeps_the_tone():
    """torchaudio's windowed sinc: a 1 kHz tone at 44.1 kHz is the same tone at 16 kHz (away from the edges)."""
    from lathe.llm.multimodal.audio import resample

    tone = torch.sin(2 * torch.pi * 1000 * torch.arange(44100) / 44100)[None].float()
    out = resample(tone, 44100, 16000)
    assert out.shape == (1, 16000)
    expected = torch.sin(2 * torch.pi * 1000 * torch.arange(16000) / 16000)
    assert float((out[0, 100:-100] - expected[100:-100]).abs().max()) < 1e-3


def test_datasets_audio_dicts_and_bytes(audio_files):
    """{"array", "sampling_rate"} (datasets' decoded audio) is averaged and resampled; {"bytes", "path"} is decoded."""
    from lathe.llm.multimodal.audio import load_audio, resample, waveform

    stereo = FILES.make_signal("x", 2, 8000, 800)
    out = waveform({"array": stereo, "sampling_rate": 8000}, 16000)
    expected = resample(torch.from_numpy(stereo).mean(dim=0, keepdim=True), 8000, 16000)[0]
    assert out.shape == (1600,) and torch.equal(torch.from_numpy(out), expected)
    raw = audio_files["song.mp3"].read_bytes()
    assert np.array_equal(
        waveform({"bytes": raw, "path": None}, 16000), load_audio(str(audio_files["song.mp3"]), 16000)
    )
    array = np.zeros(10, dtype=np.float32)
    assert waveform(array, 16000) is array  # an array is taken as it is, as LLaMA-Factory takes it


def test_bad_audio_is_one_line(tmp_path, plugin):
    bad = tmp_path / "notes.mp3"
    bad.write_text("not audio")
    with pytest.raises(ValueError, match=r"row 3: .*notes.mp3: FFmpeg cannot decode this audio"):
        plugin.regularize("audio", [str(bad)], "row 3")
    with pytest.raises(ValueError, match=r"row 3: audio file .*missing.wav' not found"):
        plugin.regularize("audio", [str(tmp_path / "missing.wav")], "row 3")


def test_missing_pyav_names_it(monkeypatch, tmp_path):
    from lathe.llm.multimodal.audio import load_audio

    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ImportError, match="PyAV .*pip install av"):
        load_audio(str(tmp_path / "x.mp3"), 16000)
