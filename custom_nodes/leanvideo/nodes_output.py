"""Output nodes: Save Video (lossless) (declaration only; the encoding is in ``video_ops``)."""

from __future__ import annotations

import os
from typing import Any

from comfy_api.latest import io, ui

from .video_ops import EXTENSION, write_lossless


class LeanVideoSaveVideoLossless(io.ComfyNode):
    """Save a video's frames bit for bit (Matroska, lossless H.264 RGB or FFV1)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LeanVideoSaveVideoLossless",
            display_name="Save Video (lossless)",
            category="image/video",
            description=(
                "Saves the video's frames exactly, as the 8-bit RGB frames Save Video encodes, in an .mkv "
                "(H.264 RGB at QP 0, or FFV1): for comparing runs or editing without generation loss. "
                "Several times the size of Save Video's .mp4; audio is not kept."
            ),
            inputs=[
                io.Video.Input("video", tooltip="The video to save, e.g. from Create Video."),
                io.String.Input(
                    "filename_prefix",
                    default="video/lossless",
                    tooltip="The file's prefix in ComfyUI's output folder (formatting as in Save Video).",
                ),
            ],
            outputs=[],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, video: Any, filename_prefix: str) -> io.NodeOutput:
        import folder_paths

        components = video.get_components()
        images = components.images
        folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(
            filename_prefix, folder_paths.get_output_directory(), images.shape[2], images.shape[1]
        )
        file = f"{name}_{counter:05}_.{EXTENSION}"
        codec = write_lossless(images, components.frame_rate, os.path.join(folder, file))
        saved = ui.PreviewVideo([ui.SavedResult(file, subfolder, io.FolderType.output)]).as_dict()
        return io.NodeOutput(ui={**saved, "text": [f"{images.shape[0]} frames, {codec}, lossless"]})


NODES: list[type[io.ComfyNode]] = [LeanVideoSaveVideoLossless]
